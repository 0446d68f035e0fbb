"""resnmt-analyze: per-layer gate values, rSkip ratios, activation gains and gradient
norms of a trained model, as JSON and one PNG per statistic.

    resnmt-analyze runs/m30k/checkpoint_best.pt --data data/multi30k/bin --split test \\
        --num-sentences 1000 --out analysis/m30k

The first ``--num-sentences`` sentences of ``--split`` are run teacher-forced on their
references in evaluation mode (no dropout), in batches of ``--batch-size`` sentences.
For each layer and sublayer it reports, averaged over every real (non-padding) token:

* what each connection measures (its class's ``measure``): SAS alpha, beta, gamma;
  rSkip+LN's effective skip:residual ratio ``1 + sum_i prod_{j<=i} sigma_j / w_j``;
  the highway gate t; the skip:residual norm ratio ``||s*x|| / ||F||`` of xSkip(+LN),
  DeepNorm and Admin; the learned lambda (mean), Admin's omega (mean), ReZero's a;
* NReLU/NSwish: rho, rho', lambda;
* every model: the gradient norm ``||dL/dh_t||`` of each layer's output, L the
  summed (label-smoothed) NLL of the batch.

Writes ``OUT/analysis.json`` and ``OUT/<statistic>.png``. Exact definitions:
``docs/analysis.md``.
"""
import argparse
import json
import logging
import re
import warnings
import sys
from pathlib import Path
from typing import Dict, List, Optional

from resnmt.analysis.hooks import CONNECTION_STATISTICS, STATISTICS
from resnmt.cli.common import OneLineErrorParser
from resnmt.options import Option, add_to_command

PROG = "resnmt-analyze"


OPTIONS = (
    Option("checkpoint", kind="path", positional=True, help="a fairseq checkpoint of a resnmt_transformer model"),
    Option("data", kind="path", help="binarized data directory (default: the path stored in the checkpoint)"),
    Option("split", "test", "split to run on: train, valid, test, ... (default: %(default)s)"),
    Option("num_sentences", 500, "analyse the first N sentences of the split (default: %(default)s; fewer if the "
           "split is smaller)", kind="int", minimum=1, metavar="N"),
    Option("batch_size", 32, "sentences per batch (default: %(default)s)", kind="int", minimum=1, metavar="B"),
    Option("out", Path("analysis"), "output directory (default: ./analysis)", kind="path"),
    Option("label_smoothing", None, "epsilon of the loss whose gradient is measured (default: the checkpoint's "
           "--label-smoothing if it trained with label_smoothed_cross_entropy, else 0 = plain NLL)",
           kind="number", metavar="EPS"),
    Option("cpu", False, "run on the CPU even if a GPU is available", kind="switch"),
    Option("no_progress_bar", False, "no tqdm progress bar", kind="switch"),
)


class AnalyzeError(Exception):
    """A refusal: printed as one line ``resnmt-analyze: error: ...``, exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog=PROG,
        description="Per-layer statistics of a resnmt_transformer checkpoint (what each connection "
        "kind learns: SAS gates, rSkip ratio, highway gate, skip:residual ratios, ReZero a, Admin omega; "
        "NReLU/NSwish gains, gradient norm of each block output), "
        "teacher-forced on a binarized split; writes OUT/analysis.json and one PNG per statistic.",
    )
    add_to_command(p, OPTIONS)
    return p


def check_paths(args) -> None:
    """Refuse missing inputs before anything heavy (torch, fairseq) is imported."""
    if not args.checkpoint.is_file():
        what = "is a directory, not a checkpoint file" if args.checkpoint.is_dir() else "not found"
        raise AnalyzeError(f"checkpoint {args.checkpoint} {what}")
    if args.data is not None and not args.data.is_dir():
        raise AnalyzeError(f"--data {args.data}: no such directory (give fairseq-preprocess's --destdir)")
    if args.label_smoothing is not None and not 0.0 <= args.label_smoothing < 1.0:
        raise AnalyzeError(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
    if args.out.exists() and not args.out.is_dir():
        raise AnalyzeError(f"--out {args.out} exists and is not a directory")


def available_splits(data_dir: Path) -> List[str]:
    return sorted({f.name.split(".")[0] for f in Path(data_dir).glob("*.idx")})


def load(args):
    """(model, task, cfg) from the checkpoint, with ``--data`` overriding its data path."""
    import resnmt  # noqa: F401  (registers the model; allow-lists checkpoint types for weights_only)
    from fairseq import checkpoint_utils

    from resnmt.checkpoints.compat import UnsafeCheckpointError

    overrides = {"data": str(args.data.resolve())} if args.data is not None else {}
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(args.checkpoint)], arg_overrides=overrides)
    except FileNotFoundError as err:
        raise AnalyzeError(f"cannot set up the checkpoint's task: {err} (give --data)")
    except UnsafeCheckpointError as err:
        raise AnalyzeError(str(err)) from None
    except Exception as err:  # unpickling errors, missing keys, ...
        raise AnalyzeError(f"cannot load {args.checkpoint} as a fairseq checkpoint: {type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''}")
    model = models[0]
    if not hasattr(model, "encoder") or not hasattr(model.encoder, "connection_spec"):
        raise AnalyzeError(f"{args.checkpoint} holds a {type(model).__name__}, not a resnmt_transformer model")
    return model, task, cfg


def load_split(task, cfg, split: str):
    data = Path(str(cfg.task.data).split(":")[0])
    try:
        task.load_dataset(split)
    except FileNotFoundError:
        have = ", ".join(available_splits(data)) or "none"
        raise AnalyzeError(f"split {split!r} not found in {data} (splits there: {have})")
    dataset = task.dataset(split)
    if getattr(dataset, "tgt", None) is None:
        raise AnalyzeError(f"split {split!r} in {data} has no target side: the analysis is teacher-forced")
    return dataset


def default_label_smoothing(cfg) -> float:
    criterion = getattr(cfg, "criterion", None)
    if criterion is not None and getattr(criterion, "_name", None) == "label_smoothed_cross_entropy":
        return float(getattr(criterion, "label_smoothing", 0.0) or 0.0)
    return 0.0


def kinds_description(kinds: Dict[str, str]) -> str:
    if len(set(kinds.values())) == 1:
        return next(iter(kinds.values()))
    return ", ".join(f"{side} {kind}" for side, kind in kinds.items())


def nest(means: Dict[str, Dict[tuple, float]], num_layers: Dict[str, int]) -> dict:
    """``{stat: {(side, layer, sublayer): v}}`` -> ``{stat: {side: {sublayer: [v or None per layer]}}}``."""
    order = {name: i for i, name in enumerate(("encoder", "decoder", "self", "cross", "ffn", "output"))}
    out: dict = {}
    for name in [n for n in STATISTICS if n in means]:  # a fixed order: connections, activation, gradient
        sides: dict = {}
        by_site = means[name]
        for side, layer, sublayer in sorted(by_site, key=lambda s: (order[s[0]], order[s[2]], s[1])):
            row = sides.setdefault(side, {}).setdefault(sublayer, [None] * num_layers[side])
            row[layer] = by_site[(side, layer, sublayer)]
        out[name] = sides
    return out


def analyze(args) -> dict:
    """Measure the checkpoint's connections on ``args.split``, write analysis.json and the
    plots into ``args.out``, print the summary; the result as written."""
    import torch

    from resnmt.analysis.hooks import side_kinds

    logging.getLogger().setLevel(logging.WARNING)  # fairseq's INFO lines would bury the summary
    # emitted by fairseq's attention on every batch; not actionable here
    warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask")
    model, task, cfg = load(args)
    dataset = load_split(task, cfg, args.split)
    n = min(args.num_sentences, len(dataset))
    if n < args.num_sentences:
        print(f"{PROG}: note: split {args.split!r} has {len(dataset)} sentences; analysing all of them", file=sys.stderr)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    model.to(device).eval()
    label_smoothing = args.label_smoothing if args.label_smoothing is not None else default_label_smoothing(cfg)
    means, ntokens, loss_sum, nll_sum = measure_batches(args, model, task, dataset, n, device, label_smoothing)
    num_layers = {"encoder": len(model.encoder.layers), "decoder": len(model.decoder.layers)}
    statistics = nest(means, num_layers)
    kinds = side_kinds(model)
    result = {
        "checkpoint": str(args.checkpoint.resolve()),
        "arch": getattr(cfg.model, "arch", None) or type(model).__name__,
        "connections": kinds,
        "normalized_activation": getattr(cfg.model, "normalized_activation", None),
        "data": str(cfg.task.data),
        "split": args.split,
        "num_sentences": n,
        "num_tokens": ntokens,
        "loss": {
            "label_smoothing": label_smoothing,
            "loss_per_token": loss_sum / max(ntokens["decoder"], 1),
            "nll_per_token": nll_sum / max(ntokens["decoder"], 1),
        },
        "descriptions": {name: STATISTICS[name].description for name in statistics},
        "statistics": statistics,
        "streams": stream_weights(model),
        "norms": learned_norms(model),
    }
    write_results(args, result, f"{num_layers['encoder']}+{num_layers['decoder']} layers, "
                  f"d={model.encoder.embed_tokens.embedding_dim}")
    return result


def measure_batches(args, model, task, dataset, n: int, device, label_smoothing: float):
    """The first ``n`` sentences of ``dataset``, longest first in batches of similar length
    (less padding, the same token-weighted means): (each statistic's means, the gradient
    norms' among them, the tokens per side, the summed loss, the summed NLL)."""
    from tqdm import tqdm

    from resnmt.analysis.gradients import BlockOutputs, block_gradient_norms
    from resnmt.analysis.hooks import Accumulator, StatsCollector

    pad = task.target_dictionary.pad()
    indices = sorted(range(n), key=lambda i: (-int(dataset.src_sizes[i]), i))
    batches = [indices[i:i + args.batch_size] for i in range(0, n, args.batch_size)]
    acc = Accumulator()
    grad_sums: Dict[tuple, List[float]] = {}
    loss_sum = nll_sum = 0.0
    ntokens = {"encoder": 0, "decoder": 0}
    collector = StatsCollector(model, acc)
    blocks = BlockOutputs(model)
    try:
        for batch in tqdm(batches, desc=PROG, unit="batch", disable=args.no_progress_bar, file=sys.stderr):
            sample = dataset.collater([dataset[i] for i in batch])
            sample = move_to(sample, device)
            grads, loss, nll = block_gradient_norms(model, sample, label_smoothing, pad, blocks)
            for site, (total, count) in grads.items():
                s = grad_sums.setdefault(site, [0.0, 0.0])
                s[0] += float(total)
                s[1] += float(count)
            loss_sum += float(loss)
            nll_sum += float(nll)
            ntokens["encoder"] += int(sample["net_input"]["src_tokens"].ne(task.source_dictionary.pad()).sum())
            ntokens["decoder"] += int(sample["target"].ne(pad).sum())
    finally:
        collector.remove()
        blocks.remove()
    means = acc.means()
    means["grad_norm"] = {site: total / count for site, (total, count) in grad_sums.items() if count > 0}
    return means, ntokens, loss_sum, nll_sum


def write_results(args, result: dict, size: str) -> None:
    """analysis.json and the plots (gates, stream weights, learned norms) into ``args.out``,
    then the summary."""
    from resnmt.analysis.plotting import plot_all, plot_learned_norms, plot_stream_weights

    statistics, kinds = result["statistics"], result["connections"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "analysis.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if not any(name in statistics for name in CONNECTION_STATISTICS):
        print(f"no gates in this model ({kinds_description(kinds)}): skipping gate plots")
    title = f"{result['arch']} ({size}; {args.split}, {result['num_sentences']} sentences)"
    written = plot_all(statistics, title, args.out, kinds)
    written += [plot_stream_weights(name, sides, title, args.out / f"{name}.png")
                for name, sides in result["streams"].items()]
    written += [plot_learned_norms(name, sides, title, args.out / f"{name}.png")
                for name, sides in result["norms"].items()]
    print_summary(result, args.out, written)


def stream_weights(model) -> Dict[str, Dict[str, list]]:
    """``{name: {side: matrix}}``: the learned weights of each side's residual stream (DLCL's
    combination weights, DenseFormer's α), for the sides that have one, and of the
    multi-stream connections (HC's, mHC's static mixing: one row per sublayer, in the
    stack's order)."""
    out: Dict[str, Dict[str, list]] = {}
    for side in ("encoder", "decoder"):
        stack = getattr(model, side)
        stream = getattr(stack, "residual_stream", None)
        for name, matrix in (stream.learned() if stream is not None else {}).items():
            out.setdefault(name, {})[side] = matrix
        for layer in stack.layers:
            for attr in ("self_attn_connection", "encoder_attn_connection", "ffn_connection"):
                conn = getattr(layer, attr, None)
                if conn is not None:
                    for name, row in conn.learned().items():
                        out.setdefault(name, {}).setdefault(side, []).append(row)
    return out


def learned_norms(model) -> Dict[str, Dict[str, dict]]:
    """``{"dyt_alpha": {side: {"layers": {where: [value per layer]}, "stack": {where: value}}}}``:
    the learned scalar of every DyT norm (``--normalization dyt``), by side and by where the
    norm sits: inside a layer (``where`` its module name there, ``self_attn_connection.norm``)
    or in the stack itself (``layer_norm``, the final norm). Empty without DyT."""
    from resnmt.connections.norms import DynamicTanh

    out: Dict[str, dict] = {}
    for name, module in model.named_modules():
        match = re.match(r"(encoder|decoder)\.(?:layers\.(\d+)\.)?(.+)$", name)
        if not isinstance(module, DynamicTanh) or match is None:
            continue
        side, layer, where = match.groups()
        places = out.setdefault(side, {"layers": {}, "stack": {}})
        alpha = float(module.alpha.detach()[0])
        if layer is None:
            places["stack"][where] = alpha
        else:
            values = places["layers"].setdefault(where, [])
            values.extend([None] * (int(layer) + 1 - len(values)))
            values[int(layer)] = alpha
    return {"dyt_alpha": out} if out else {}


def move_to(sample, device):
    from fairseq import utils

    return sample if device.type == "cpu" else utils.move_to_cuda(sample, device=device)


def print_summary(result: dict, out: Path, written) -> None:
    print(f"{result['arch']}: {result['num_sentences']} sentences of {result['split']!r}, "
          f"{result['num_tokens']['decoder']} target tokens, loss {result['loss']['loss_per_token']:.3f}/token")
    for name, sides in result["statistics"].items():
        parts = []
        for side, rows in sides.items():
            for sublayer, values in rows.items():
                shown = " ".join("-" if v is None else f"{v:.3g}" for v in values)
                parts.append(f"{side[:3]}/{sublayer}: {shown}")
        print(f"  {name:14s} " + "; ".join(parts))
    print(f"wrote {out / 'analysis.json'} and {len(written)} plots: {', '.join(p.name for p in written)}")


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG
    try:
        check_paths(args)
        analyze(args)
    except AnalyzeError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
