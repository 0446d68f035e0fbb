"""fairseq's own training as the benchmarks drive it: the config, task, model and
criterion fairseq-train builds from its command line (fp16.py's first step), its
Trainer, updates run through ``Trainer.train_step`` and timed, the model FLOPs of one
update, the card's matrix-product rate, the torch.compile graphs made so far and a
profile of one update (gpu_train.py).
"""
import re
import time
from typing import Sequence

from eager_training import TORCH_DTYPES, training_batches


def fairseq_training(argv: Sequence[str]):
    """What ``fairseq_cli.train.main`` builds from a fairseq-train command line (without
    the program; resnmt-train's untying of ``--bf16`` from TPUs included), in its order:
    ``(cfg, task, model, criterion)``, the seeds set before the model is built."""
    import numpy as np
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from resnmt.training.bf16 import untie_bf16_from_tpu

    argv = [str(x) for x in argv]
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    untie_bf16_from_tpu(args, argv)  # resnmt-train's parse
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    np.random.seed(cfg.common.seed)
    utils.set_torch_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return cfg, task, model, task.build_criterion(cfg.criterion)


def build_trainer(argv: Sequence[str]):
    """``(trainer, task, cfg)``: fairseq's Trainer as fairseq-train builds it from ``argv``."""
    from fairseq.trainer import Trainer

    cfg, task, model, criterion = fairseq_training(argv)
    return Trainer(cfg, task, model, criterion), task, cfg


def first_batches(task, cfg, n: int):
    """The first ``n`` batches of epoch 1 as fairseq-train builds them from ``cfg`` (seed 1)."""
    task.load_dataset("train", combine=False, epoch=1)
    return training_batches(task, cfg.dataset.max_tokens, n)


def synchronize(cpu: bool):
    import torch

    if not cpu:
        torch.cuda.synchronize()


def run_updates(trainer, batches, start: int, n: int):
    """``n`` updates through Trainer.train_step; returns target tokens trained on."""
    tokens = 0
    for i in range(start, start + n):
        sample = batches[i % len(batches)]
        trainer.train_step([sample])
        tokens += int(sample["ntokens"])
    return tokens


def count_flops(trainer, sample) -> float:
    """Matrix-unit FLOPs of one forward and backward of ``sample`` (torch's flop counter).
    Counted in eval mode (no dropout, the same matrix products), where --compile-layers
    runs its layers eagerly: the counter sees every product, compiled or not."""
    from torch.utils.flop_counter import FlopCounterMode

    model, criterion = trainer.model, trainer.criterion
    sample = trainer._prepare_sample(sample)[0]
    model.eval()
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            loss, _, _ = criterion(model, sample)
            loss.backward()
    finally:
        model.train()
        model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def compiled_graphs() -> int:
    """How many graphs torch.compile has made in this process."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def matmul_rate(cpu: bool, size: int, dtype: str, reps: int = 10) -> float:
    """The device's measured matrix-product rate in ``dtype`` (TFLOP/s): ``size``-cubed
    products. A configuration's MFU is taken against the rate of the dtype it trained in:
    a CPU without native bf16 emulates bf16 products far below its fp32 rate."""
    import torch

    device = "cpu" if cpu else "cuda"
    a = torch.randn(size, size, device=device, dtype=getattr(torch, TORCH_DTYPES[dtype]))
    b = torch.randn(size, size, device=device, dtype=a.dtype)
    for _ in range(3):
        a @ b
    synchronize(cpu)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    synchronize(cpu)
    seconds = (time.perf_counter() - t0) / reps
    return 2 * size ** 3 / seconds / 1e12


def peak_rates(cpu: bool, size: int, dtypes) -> dict:
    """What the environment line records of the device's peak: the product size and the
    measured rate of each dtype in ``dtypes`` (``peak_tflops``: {dtype: TFLOP/s})."""
    return {"matmul_size": size, "peak_tflops": {d: matmul_rate(cpu, size, d) for d in dtypes}}


# the Tensor methods that read a tensor's value on the host: on a CUDA tensor each waits for
# the GPU to finish what was queued (a host-device synchronisation)
HOST_READS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "cpu", "nonzero")


def host_reads(trainer, batches, start: int, n: int = 2) -> list:
    """Where ``n`` updates read tensor values on the host, per update: the Python line
    (the innermost fairseq or resnmt frame), the method and the tensor's device, most
    frequent first. On the CPU nothing waits; on a GPU each read of a CUDA tensor is a
    synchronisation, so this names the sites a profile's sync count comes from."""
    import traceback
    from collections import Counter

    import torch

    counts = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(name):
        original = originals[name]

        def read(tensor, *args, **kwargs):
            frames = traceback.extract_stack()[:-1]
            site = next((f for f in reversed(frames) if re.search(r"(fairseq|resnmt)/", f.filename)), frames[-1])
            where = re.sub(r".*/(?=(fairseq|resnmt)/)", "", site.filename)
            counts[(f"{where}:{site.lineno}", name, tensor.device.type, (site.line or "").strip())] += 1
            return original(tensor, *args, **kwargs)
        return read

    try:
        for name in HOST_READS:
            setattr(torch.Tensor, name, counted(name))
        run_updates(trainer, batches, start, n)
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return [{"site": site, "read": name, "device": device, "per_update": c / n, "line": line[:160]}
            for (site, name, device, line), c in counts.most_common()]


def device_time(e) -> float:
    """A profiler event's own device time (microseconds)."""
    return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) or 0


def kernels_and_ranges(events):
    """The kernels of profiler ``events`` (longest first) and, apart, the ``record_function``
    ranges with a device time: a range ("forward", "Optimizer.step") reports its whole span on
    the GPU timeline, idle gaps and the kernels inside it included, so summed with the
    kernels it would count them twice."""
    ranges = [e for e in events if getattr(e, "is_user_annotation", False) and device_time(e) > 0]
    kernels = [e for e in events if device_time(e) > 0 and not e.key.startswith(("aten::", "autograd::"))
               and not getattr(e, "is_user_annotation", False)]
    return sorted(kernels, key=device_time, reverse=True), ranges


def profile_update(trainer, batches, cpu: bool) -> dict:
    """torch.profiler over one update (after warm-up): top kernels, launches, syncs; then
    where two more updates read tensor values on the host (:func:`host_reads`)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([] if cpu else [ProfilerActivity.CUDA])
    synchronize(cpu)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        run_updates(trainer, batches, 0, 1)
        synchronize(cpu)
    wall = time.perf_counter() - t0
    events = prof.key_averages()

    def count(pattern):
        return sum(e.count for e in events if re.search(pattern, e.key))

    kernels, ranges = kernels_and_ranges(events)
    ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    return {
        "wall_ms": 1e3 * wall,
        "device_time_ms": sum(device_time(e) for e in kernels) / 1e3,
        "ranges_ms": {e.key[:80]: device_time(e) / 1e3 for e in ranges},  # spans, not added to device_time_ms
        "kernel_launches": count(r"^(cudaLaunchKernel|cuLaunchKernel|cudaLaunchKernelExC)$"),
        "host_syncs": {k: count(rf"^{k}$") for k in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                    "cudaEventSynchronize")},
        "memcpy_dtoh_or_sync_copies": count(r"^Memcpy DtoH") + count(r"^aten::_local_scalar_dense$"),
        "item_calls": count(r"^aten::item$"),
        "top_kernels": [{"name": e.key[:160], "count": e.count, "device_ms": device_time(e) / 1e3}
                        for e in kernels[:15]],
        "top_cpu_ops": [{"name": e.key[:160], "count": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3}
                        for e in ops[:15]],
        "host_reads": host_reads(trainer, batches, 1),
    }
