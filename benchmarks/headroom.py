"""What fp16 would have to hold, measured without a GPU (fp16.py --headroom): the first
training step of a kind in float32 on the CPU, as fairseq-train takes it (or one step of a
trained checkpoint), its loss and gradient norm as fairseq logs them, the largest gradient
(hence the largest loss scale fp16 holds), block output and logit; recorded per kind.
"""
import math
import sys
import time
from pathlib import Path

from eager_training import training_batches
from fairseq_trainer import fairseq_training
from result_tables import headroom_table

from resnmt.experiment.presets import SIZES
from resnmt.experiment.results import append_jsonl
from resnmt.study import runs
from resnmt.study.records import cpu_description, portable_path, run_id
from campaign.rows import QUALITY_ROWS


FP16_MAX = 65504.0  # the largest finite float16


def first_step(train_argv, checkpoint=None, data=None) -> dict:
    """One training step in float32 on the CPU, as ``fairseq-train train_argv`` takes its
    first one (``fairseq_trainer.fairseq_training``: the seed set before the model is built, the first
    batch of epoch 1, the trainer's seed before the forward pass), or with the weights of
    ``checkpoint`` (its own settings, ``data`` as the data directory). Returns the loss and
    gradient norm as fairseq logs them (base 2 per token; gradient norm of the loss divided
    by the sample size) and the largest values fp16 would have to hold."""
    import torch

    import resnmt  # noqa: F401  (registers the archs; checkpoints load with weights_only)
    from fairseq import checkpoint_utils, utils

    if checkpoint is None:
        cfg, task, model, criterion = fairseq_training(train_argv[1:])
        updates = 0
    else:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(checkpoint)], arg_overrides={"data": str(data)} if data else None)
        model = models[0].float()
        updates = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))["optimizer_history"][-1]["num_updates"]
        criterion = task.build_criterion(cfg.criterion)
    task.load_dataset("train", epoch=1)
    (sample,) = training_batches(
        task, cfg.dataset.max_tokens, 1, seed=cfg.common.seed, max_sentences=cfg.dataset.batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions(), cfg.dataset.max_tokens),
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple)

    outputs = {}
    def record(name):
        def hook(module, inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            outputs[name] = out.detach().abs().max().item()
        return hook
    hooks = [layer.register_forward_hook(record(f"{side}.layers.{i}"))
             for side in ("encoder", "decoder") for i, layer in enumerate(getattr(model, side).layers)]
    hooks.append(model.decoder.register_forward_hook(record("logits")))
    model.train()
    criterion.train()
    utils.set_torch_seed(cfg.common.seed)  # the trainer's seed for update 0 (dropout masks)
    loss, sample_size, _ = criterion(model, sample)
    loss.backward()
    for h in hooks:
        h.remove()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    largest_grad, largest_param = max((g.abs().max().item(), n) for n, g in grads.items())
    grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])).item()
    logits = outputs.pop("logits")
    largest_output, largest_at = max((v, k) for k, v in outputs.items())
    return {
        "loss": loss.item() / sample_size / math.log(2), "grad_norm": grad_norm / sample_size,
        "largest_grad": largest_grad, "largest_grad_param": largest_param,
        "max_fp16_loss_scale": FP16_MAX / largest_grad,
        "largest_block_output": largest_output, "largest_block_output_at": largest_at, "largest_logit": logits,
        "sample_size": int(sample_size), "updates": int(updates),
    }


def measure_headroom(a, rows) -> int:
    import torch

    torch.set_num_threads(a.threads)
    if a.checkpoint:
        probes = [(portable_path(c), None, Path(c)) for c in a.checkpoint]
    else:
        probes = [(row, row, None) for row in rows]
    started = run_id()
    # a checkpoint keeps its own size, batch size and dropout
    settings = ({"at": "checkpoint"} if a.checkpoint else
                {"at": "initialization", "size": a.size, "max_tokens": a.max_tokens, "dropout": 0.1})
    settings["dtype"] = "float32"  # the device is in the record (cpu_description)
    records = []
    for name, row, checkpoint in probes:
        if row is None:
            arch, flags, argv = None, None, None
        else:
            arch, flags = QUALITY_ROWS[row].arch, list(QUALITY_ROWS[row].flags)
            argv = runs.benchmark_train_argv(
                a.bin_dir, arch, flags, SIZES[a.size], seed=1, max_tokens=a.max_tokens, lr=a.lr,
                warmup=a.warmup, dropout=0.1, save_every=1, keep=1, validate=False)
        t0 = time.time()
        rec = {"row": name, "arch": arch, "flags": flags,
               **first_step(argv, checkpoint, data=a.bin_dir.resolve() if checkpoint else None)}
        print(f"[fp16 headroom] {name}: loss {rec['loss']:.3f}, largest gradient {rec['largest_grad']:.1f} "
              f"({rec['largest_grad_param']}), fp16 holds a loss scale up to {rec['max_fp16_loss_scale']:.3g} "
              f"({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
        records.append(rec)
        append_jsonl(Path(a.out), {"benchmark": "fp16-headroom", "run_id": started, "settings": settings,
                                   **cpu_description(), **rec})
    print(headroom_table(records))
    return 0
