#!/usr/bin/env python
"""Training speed, beam-4 decoding speed and peak memory of resnmt's connections,
each as a ratio to a reference measured interleaved in the same run.

Every measurement runs in a fresh subprocess (so peak memory is that config's alone):
it builds the model through fairseq's real argument parser, trains ``--warmup`` +
``--updates`` steps (forward, backward, Adam) on the first batches of the binarized
training data, then decodes ``--decode-sentences`` validation sentences with fairseq's
``SequenceGenerator`` (beam 4). Each row compares a config with its reference
(fairseq's ``transformer`` of the same size, or the plain activation for NReLU/NSwish);
the two are measured back to back, in alternating order, once per round, and a row's
ratio is the median over rounds of the per-round ratio.

Outputs: one JSON line per row appended to ``--out`` (default
``benchmarks/results/speed.jsonl``), and the markdown table on stdout.

    python benchmarks/speed.py                         # CPU, 6+6 d=256 FFN 1024 4 heads
    python benchmarks/speed.py --device cuda --size base  # GPU, fairseq's base sizes
    python benchmarks/speed.py --device cuda --dtype bf16 --warmup 5 --updates 20  # the GPU table's runs
"""
import argparse
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common
from common import Comparison, Optimizer, fairseq_argv, train_step, training_batches
from fairseq_trainer import compiled_graphs  # torch.compile graphs so far (--fused-connections); 0 eager
from result_tables import speed_table

from resnmt.experiment.presets import SIZES
from resnmt.shared import read_jsonl

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT / "data" / "multi30k" / "bin"
DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "speed.jsonl"

# the speed table's rows: a config against its reference, the train, decode and memory targets
ROWS = {
    "post_ln": Comparison("post_ln", "transformer", 0.98, 0.98, 1.05),
    "pre_ln": Comparison("pre_ln", "transformer_prenorm", 0.98, 0.98, 1.05),
    "xskip_ln (λ=2)": Comparison("xskip_ln2", "transformer", 0.97, 0.97, 1.05),
    "rskip_ln (λ=2)": Comparison("rskip_ln2", "transformer", 0.93, 0.93, 1.05),
    "sas (gate h)": Comparison("sas", "transformer", None, None, None),
    "sas (gate 64)": Comparison("sas_gate64", "transformer", 0.90, 0.90, None),
    "highway": Comparison("highway", "transformer", None, None, 1.05),
    # targets by analogy (set before measuring): deepnorm and admin cost what xskip_ln costs
    # (plus a per-dimension multiply for admin); rezero is post-LN's work without the LayerNorm
    "deepnorm": Comparison("deepnorm", "transformer", 0.97, 0.97, 1.05),
    "admin": Comparison("admin", "transformer", 0.97, 0.97, 1.05),
    "rezero": Comparison("rezero", "transformer", 0.98, 0.98, 1.05),
    "nswish vs swish": Comparison("nswish", "swish", 0.93, 0.93, 1.05),
    "nrelu vs relu": Comparison("nrelu", "post_ln", 0.93, 0.93, 1.05),
    # issue #15's targets for --fused-connections (SAS with the paper's gate: >= 1.0 of
    # its MAC prediction, reported as sas_overhead.measured_over_predicted)
    "sas (gate h) fused": Comparison("sas_fused", "transformer", None, None, None),
    "sas (gate 64) fused": Comparison("sas_gate64_fused", "transformer", 0.86, None, None),
    "nswish vs swish (fused)": Comparison("nswish_fused", "swish", 0.97, 0.95, 1.05),
    "nrelu vs relu (fused)": Comparison("nrelu_fused", "post_ln", 0.97, 0.95, 1.05),
    # targets by analogy, set before measuring: B2T adds one sum per layer; ResiDual one sum
    # per sublayer and a final LN; Peri-LN one LN per sublayer over pre-LN; DLCL a weighted
    # sum of up to N+1 tensors and an LN per layer; RMSNorm and DyT do what a LayerNorm does
    "peri_ln": Comparison("peri_ln", "transformer_prenorm", 0.93, 0.93, 1.05),
    "b2t": Comparison("b2t", "transformer", 0.98, 0.98, 1.05),
    "resi_dual": Comparison("resi_dual", "transformer", 0.97, 0.97, 1.05),
    "dlcl": Comparison("dlcl", "transformer_prenorm", 0.93, 0.93, 1.05),
    "dlcl_post": Comparison("dlcl_post", "transformer", 0.93, 0.93, 1.05),
    "pre_ln + rms_norm": Comparison("pre_ln_rms_norm", "pre_ln", 0.98, 0.98, 1.05),
    "post_ln + rms_norm": Comparison("post_ln_rms_norm", "post_ln", 0.98, 0.98, 1.05),
    "pre_ln + dyt": Comparison("pre_ln_dyt", "pre_ln", 0.98, 0.98, 1.05),
    "post_ln + dyt": Comparison("post_ln_dyt", "post_ln", 0.98, 0.98, 1.05),
    # the 2025 kinds (issue 44); targets by analogy, set before measuring: hyper and mhc
    # carry n = 4 streams (a mix of n+1 by n per sublayer; mhc adds a (nC, n²+2n) projection
    # and 20 Sinkhorn iterations per position), memory for the n-wide activations; mix_ln
    # and ln_scaling are pre-LN's work; hybrid_norm adds three per-head norms per attention
    # and one LN per FFN; denseformer a weighted sum of up to N+1 tensors per layer
    "hyper": Comparison("hyper", "transformer_prenorm", 0.80, 0.85, 1.30),
    "mhc": Comparison("mhc", "transformer_prenorm", 0.70, 0.75, 1.35),
    "ln_scaling": Comparison("ln_scaling", "transformer_prenorm", 0.97, 0.97, 1.05),
    "denseformer": Comparison("denseformer", "transformer_prenorm", 0.93, 0.93, 1.05),
    "mix_ln vs post_ln": Comparison("mix_ln", "transformer", 0.97, 0.97, 1.05),
    "mix_ln vs pre_ln": Comparison("mix_ln", "transformer_prenorm", 0.98, 0.98, 1.05),
    "hybrid_norm vs post_ln": Comparison("hybrid_norm", "transformer", 0.90, 0.90, 1.10),
    "hybrid_norm vs pre_ln": Comparison("hybrid_norm", "transformer_prenorm", 0.90, 0.90, 1.10),
}
# --------------------------------------------------------------------------- worker


def read_status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
def measure(spec):
    """One config, in this (fresh) process: dict of throughput and memory numbers."""
    import torch

    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    cuda = device.type == "cuda"

    from fairseq import options, tasks
    from fairseq.sequence_generator import SequenceGenerator
    from fairseq import utils

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, input_args=fairseq_argv(spec["data"], spec["config"], spec["size"], spec["max_tokens"])
    )
    task = tasks.setup_task(args)
    task.load_dataset("train")
    task.load_dataset("valid")
    batches = training_batches(task, spec["max_tokens"], spec["warmup"] + spec["updates"])
    valid = task.dataset("valid")
    n_dec = min(spec["decode_sentences"], len(valid))
    dec_batches = [
        valid.collater([valid[i] for i in range(s, min(s + spec["decode_batch"], n_dec))])
        for s in range(0, n_dec, spec["decode_batch"])
    ]
    if cuda:
        batches = [utils.move_to_cuda(b) for b in batches]
        dec_batches = [utils.move_to_cuda(b) for b in dec_batches]

    if cuda:  # several configs are measured in one process on a GPU: each starts from a clean slate
        import gc

        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        mem0 = torch.cuda.memory_allocated()
    else:
        mem0 = read_status_kb("VmRSS") * 1024
    torch.manual_seed(1)
    dtype = getattr(torch, DTYPES[spec.get("dtype", "fp32")])
    model = task.build_model(args).to(device=device, dtype=dtype)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = Optimizer(model, dtype)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    for batch in batches[: spec["warmup"]]:
        train_step(model, optimizer, batch, task.target_dictionary.pad())
    sync()
    warmup_train_s, graphs_after_warmup = time.perf_counter() - t0, compiled_graphs()
    t0, c0 = time.perf_counter(), time.process_time()
    for batch in batches[spec["warmup"]:]:
        train_step(model, optimizer, batch, task.target_dictionary.pad())
    sync()
    train_time, train_cpu = time.perf_counter() - t0, time.process_time() - c0
    train_tokens = sum(int(b["ntokens"]) for b in batches[spec["warmup"]:])
    if cuda:
        peak = torch.cuda.max_memory_allocated() - mem0
    else:
        peak = read_status_kb("VmHWM") * 1024 - mem0
    optimizer.zero_grad()
    optimizer_overflows = optimizer.overflows
    del optimizer

    model.eval()
    generator = SequenceGenerator(
        [model], task.target_dictionary, beam_size=4,
        # every hypothesis gets exactly decode_len tokens: an untrained model's output
        # length is arbitrary, and the cost of a step must be compared, not luck
        max_len_a=0, max_len_b=spec["decode_len"], min_len=spec["decode_len"],
    )
    t0 = time.perf_counter()
    generator.generate([model], dec_batches[0])  # warm-up
    sync()
    warmup_decode_s, graphs_after_decode_warmup = time.perf_counter() - t0, compiled_graphs()
    t0, c0 = time.perf_counter(), time.process_time()
    n_sent = 0
    for batch in dec_batches:
        generator.generate([model], batch)
        n_sent += batch["nsentences"]
    sync()
    decode_time, decode_cpu = time.perf_counter() - t0, time.process_time() - c0
    src_tokens = sum(int(b["net_input"]["src_tokens"].numel()) for b in batches[spec["warmup"]:])
    tgt_padded = sum(int(b["target"].numel()) for b in batches[spec["warmup"]:])
    return {
        "config": spec["config"],
        "train_tokens_per_s": train_tokens / train_time,
        "decode_sentences_per_s": n_sent / decode_time,
        # per second of this process's CPU time: on a shared CPU (1 thread) this is the
        # config's own cost, not the share of the cores the scheduler happened to give it
        "train_tokens_per_cpu_s": train_tokens / train_cpu,
        "decode_sentences_per_cpu_s": n_sent / decode_cpu,
        "peak_memory_bytes": peak,
        "params": n_params,
        "train_tokens": train_tokens,
        "train_padded_src_tokens": src_tokens,
        "train_padded_tgt_tokens": tgt_padded,
        "decode_sentences": n_sent,
        "skipped_updates": optimizer_overflows,
        # first batches (compilation with --fused-connections): wall seconds, and graphs
        # compiled: none may appear after the warm-ups (one graph serves every batch shape)
        "warmup_train_s": warmup_train_s,
        "warmup_decode_s": warmup_decode_s,
        "graphs_after_train_warmup": graphs_after_warmup,
        "graphs_after_decode_warmup": graphs_after_decode_warmup,
        "graphs_at_end": compiled_graphs(),
    }


# --------------------------------------------------------------------------- analysis


def sas_overhead(size, vocab, gate_dim, src_per_tgt=1.0):
    """Analytic per-target-token MACs and parameters of the model and of SAS's gates.

    Per token per sublayer the two gates cost 2*(2h*g + g) MACs (first layer 2h -> g,
    second g -> 1; g = gate hidden size, h in the paper) and hold 2*(2h*g + 2g + 1)
    parameters. The model's own matmuls per token: encoder layer 4h^2 + 2hf (q,k,v,out
    projections, FFN), decoder layer 4h^2 + 2h^2 + 2hf per target token (self-attention,
    cross-attention q/out, FFN) + 2h^2 per source token (cross-attention k/v), output
    projection hV per target token. Attention scores (O(T) per token) are left out.
    """
    layers, h, f, _ = size
    g = gate_dim or h
    enc_tok = layers * (4 * h * h + 2 * h * f)
    dec_tok = layers * (6 * h * h + 2 * h * f) + h * vocab
    model_macs = src_per_tgt * (enc_tok + layers * 2 * h * h) + dec_tok
    gate_tok = 2 * (2 * h * g + g)
    gate_macs = src_per_tgt * layers * 2 * gate_tok + layers * 3 * gate_tok
    gate_params = (2 * layers + 3 * layers) * 2 * (2 * h * g + 2 * g + 1)
    return {
        "gate_dim": g,
        "model_macs_per_tgt_token": model_macs,
        "gate_macs_per_tgt_token": gate_macs,
        "mac_overhead": gate_macs / model_macs,
        "predicted_train_ratio": model_macs / (model_macs + gate_macs),
        "gate_params": gate_params,
    }


# --------------------------------------------------------------------------- driver


def machine_description(device):
    """Where the measurements ran (recorded in each raw and result line)."""
    machine = {
        "host": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count(),
        "device": device, "python": platform.python_version(),
    }
    try:
        import torch

        machine["torch"] = torch.__version__
        if device == "cuda":
            machine["gpu"] = torch.cuda.get_device_name(0)
    except Exception:  # pragma: no cover - informational only
        pass
    return machine


def run_worker(specs, timeout):
    """Measure ``specs`` in order in one fresh process; their results, in order.

    On the CPU each config gets a process of its own (its peak memory is the process's);
    on a GPU one process measures a whole round (peak memory is reset per config), which
    saves a process start, CUDA's initialization and the imports per measurement."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(specs)]
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(specs[0]["threads"])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout * len(specs),
                          cwd=str(REPO_ROOT))
    if proc.returncode != 0:
        raise RuntimeError(f"measurement of {', '.join(s['config'] for s in specs)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"median": None, "min": None, "max": None, "values": []}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(DEFAULT_DATA),
                   help="fairseq-binarized data with train and valid splits and a joined dictionary "
                   "(default: data/multi30k/bin, from data-prep/prepare-multi30k.sh)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="default: cpu")
    p.add_argument("--size", default=None, choices=sorted(SIZES),
                   help="model size: cpu = 6+6 layers d=256 FFN 1024 4 heads, base = 6+6 d=512 FFN 2048 "
                   "8 heads, tiny = 2+2 d=16 (tests) (default: cpu on --device cpu, base on cuda)")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES),
                   help="the model's precision (default: fp32); fp16 and bf16 (GPU only) train the way fairseq's "
                   "--fp16/--bf16 do: half-precision model, float32 master weights, fp16 with a loss scale")
    p.add_argument("--threads", type=int, default=1, help="torch threads per measurement (default: 1)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved repeats per row (default: 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed training updates first (default: 1)")
    p.add_argument("--updates", type=int, default=3, help="timed training updates (default: 3)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per training batch (default: 1024 on cpu, 4096 on cuda)")
    p.add_argument("--decode-sentences", type=int, default=48,
                   help="validation sentences decoded (default: 48; 512 recommended on cuda)")
    p.add_argument("--decode-batch", type=int, default=16, help="sentences per decoding batch (default: 16)")
    p.add_argument("--decode-len", type=int, default=20,
                   help="every hypothesis is decoded to exactly this many tokens (default: 20)")
    p.add_argument("--rows", default=",".join(ROWS),
                   help="comma-separated rows (default: all): " + ", ".join(ROWS))
    p.add_argument("--out", default=str(DEFAULT_OUT), help="JSON lines appended here (default: %(default)s)")
    p.add_argument("--raw", help="every measured pair is appended here as it lands "
                   "(default: OUT's name with -raw, e.g. benchmarks/results/speed-raw.jsonl)")
    p.add_argument("--from-raw", metavar="RUN_ID",
                   help="measure nothing: summarize the rounds of run RUN_ID found in --raw (e.g. an "
                   "interrupted run) and append its rows to --out")
    p.add_argument("--timeout", type=int, default=900, help="seconds allowed per measurement")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.worker:
        specs = json.loads(a.worker)
        if specs[0]["device"] == "cuda":
            # untimed: the process's first training updates select and load the GPU's kernels
            # for each batch shape (measured: the first config then ran 7x slower than later ones)
            measure(specs[0])
        print(json.dumps([measure(spec) for spec in specs]))
        return 0
    if a.dtype != "fp32" and a.device != "cuda":
        p.error(f"--dtype {a.dtype}: half precision is measured on a GPU only (--device cuda); "
                "on the CPU use --dtype fp32")

    size_name = a.size or ("base" if a.device == "cuda" else "cpu")
    size = SIZES[size_name]
    max_tokens = a.max_tokens or (4096 if a.device == "cuda" else 1024)
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; choose from: {', '.join(ROWS)}")
    if not (Path(a.data) / "dict.en.txt").exists() and not list(Path(a.data).glob("dict.*.txt")):
        p.error(f"--data {a.data}: no fairseq dictionary there; run "
                "bash data-prep/prepare-multi30k.sh data/multi30k (--mirror DIR for a local copy)")

    base_spec = {
        "data": str(Path(a.data).resolve()), "device": a.device, "size": list(size), "threads": a.threads,
        "warmup": a.warmup, "updates": a.updates, "max_tokens": max_tokens, "dtype": a.dtype,
        "decode_sentences": a.decode_sentences, "decode_batch": a.decode_batch, "decode_len": a.decode_len,
    }
    raw_path = Path(a.raw) if a.raw else Path(a.out).with_name(Path(a.out).stem + "-raw.jsonl")
    if a.from_raw:
        run_id = a.from_raw
        raws = [r for r in read_jsonl(raw_path) if r["run_id"] == run_id]
        if not raws:
            p.error(f"no measurements of run {run_id} in {raw_path}")
        base_spec, size_name, size = raws[0]["spec"], raws[0]["size_name"], tuple(raws[0]["spec"]["size"])
        machine = raws[0].get("machine") or machine_description(base_spec["device"])
        per_row = {}
        for r in raws:
            per_row.setdefault(r["row"], []).append(r["results"])
        rows = [r for r in ROWS if r in per_row]
    else:
        run_id = common.run_id()
        machine = machine_description(a.device)
        per_row = {r: [] for r in rows}
        started = time.time()
        raw_path.parent.mkdir(parents=True, exist_ok=True)
        for rnd in range(a.rounds):
            orders = {row: (ROWS[row].reference, ROWS[row].config) if rnd % 2 == 0 else (ROWS[row].config, ROWS[row].reference)
                      for row in rows}
            if a.device == "cuda":  # the whole round in one process
                specs = [dict(base_spec, config=c) for row in rows for c in orders[row]]
                measured = iter(run_worker(specs, a.timeout))
                round_results = {row: {c: next(measured) for c in orders[row]} for row in rows}
            for row in rows:
                config, ref = ROWS[row].config, ROWS[row].reference
                order = orders[row]
                if a.device == "cuda":
                    res = round_results[row]
                else:
                    res = {c: run_worker([dict(base_spec, config=c)], a.timeout)[0] for c in order}
                per_row[row].append(res)
                with open(raw_path, "a", encoding="utf-8") as f:  # every pair kept as it lands
                    f.write(json.dumps({"benchmark": "speed_raw", "run_id": run_id, "round": rnd + 1, "row": row,
                                        "order": list(order), "results": res, "spec": base_spec,
                                        "size_name": size_name, "machine": machine}, ensure_ascii=False) + "\n")
                u = "cpu_s" if a.device == "cpu" else "s"
                print(f"[speed] round {rnd + 1}/{a.rounds} {row}: train x{res[config]['train_tokens_per_' + u] / res[ref]['train_tokens_per_' + u]:.3f} "
                      f"decode x{res[config]['decode_sentences_per_' + u] / res[ref]['decode_sentences_per_' + u]:.3f} "
                      f"memory x{res[config]['peak_memory_bytes'] / max(res[ref]['peak_memory_bytes'], 1):.3f} "
                      f"({time.time() - started:.0f}s)", file=sys.stderr, flush=True)

    vocab = sum(1 for _ in open(next(Path(base_spec["data"]).glob("dict.*.txt")), encoding="utf-8")) + 4
    # CPU: rates per second of process CPU time (1 thread); GPU: wall clock (synchronized)
    clock = "process CPU time" if base_spec["device"] == "cpu" else "wall clock"
    unit = "cpu_s" if base_spec["device"] == "cpu" else "s"
    results = []
    for row in rows:
        row_spec = ROWS[row]
        config, ref, t_train, t_dec, t_mem = (row_spec.config, row_spec.reference, row_spec.train, row_spec.decode,
                                              row_spec.memory)
        runs = per_row[row]
        ratio = lambda key: summarize([r[config][key] / r[ref][key] if r[ref][key] > 0 else None for r in runs])
        rec = {
            "benchmark": "speed", "run_id": run_id, "row": row, "config": config, "reference": ref,
            "size": dict(zip(("layers", "dim", "ffn", "heads"), size), name=size_name),
            "settings": {k: base_spec.get(k, "fp32") for k in ("device", "dtype", "threads", "warmup", "updates",
                                                                "max_tokens", "decode_sentences", "decode_batch",
                                                                "decode_len")},
            "machine": machine, "rounds": len(runs),
            "clock": clock,
            "train_ratio": ratio(f"train_tokens_per_{unit}"),
            "decode_ratio": ratio(f"decode_sentences_per_{unit}"),
            "wall_clock_train_ratio": ratio("train_tokens_per_s"),
            "wall_clock_decode_ratio": ratio("decode_sentences_per_s"),
            "memory_ratio": ratio("peak_memory_bytes"),
            "params_ratio": runs[0][config]["params"] / runs[0][ref]["params"],
            "target_train": t_train, "target_decode": t_dec, "target_memory": t_mem,
            "absolute": {
                c: {k: statistics.median(r[c][k] for r in runs)
                    for k in ("train_tokens_per_s", "decode_sentences_per_s", "train_tokens_per_cpu_s",
                              "decode_sentences_per_cpu_s", "peak_memory_bytes", "params",
                              "warmup_train_s", "warmup_decode_s", "graphs_at_end") if k in runs[0][c]}
                for c in (config, ref)
            },
        }
        if config.startswith("sas"):
            gate_dim = 64 if config.startswith("sas_gate64") else None
            src = sum(r[config]["train_padded_src_tokens"] for r in runs)
            tgt = sum(r[config]["train_padded_tgt_tokens"] for r in runs)
            rec["sas_overhead"] = sas_overhead(size, vocab, gate_dim, src / tgt)
            rec["sas_overhead"]["measured_over_predicted"] = (
                rec["train_ratio"]["median"] / rec["sas_overhead"]["predicted_train_ratio"]
                if rec["train_ratio"]["median"] else None
            )
        results.append(rec)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as f:
        for rec in results:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(speed_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
