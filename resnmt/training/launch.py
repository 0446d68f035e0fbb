"""Data-parallel ranks on the CPU with every launcher: fairseq 0.12.3's launch code assumes
one CUDA device per rank. Each function below patches one place of it (idempotent), so that
a cluster command runs as printed on a laptop with ``--cpu`` (gloo over TCP), the same
``torch.distributed`` code a GPU run takes, NCCL aside.
"""
import functools


def ddp_on_cpu_modules() -> None:
    """``--ddp-backend c10d``/``pytorch_ddp`` (fairseq's default) on a CPU module.

    fairseq 0.12.3 (``fairseq/models/distributed_fairseq_model.py``) builds torch's
    ``DistributedDataParallel(module, device_ids=[device_id], output_device=device_id, ...)``
    whatever the module's device; torch refuses ``device_ids`` for a module on the CPU
    (``ValueError: DistributedDataParallel device_ids and output_device arguments only work
    with single-device/multiple-device GPU modules or CPU modules``). The constructor that
    module calls is replaced by one that drops ``device_ids`` and ``output_device`` where
    every parameter is on the CPU (torch's documented use for CPU modules) and passes
    everything else on unchanged; a GPU module is built exactly as before."""
    from fairseq.models import distributed_fairseq_model as dfm

    if getattr(dfm.DistributedDataParallel, "resnmt_cpu_ddp", False):
        return
    ddp = dfm.DistributedDataParallel

    @functools.wraps(ddp, updated=())
    def distributed_data_parallel(module, *args, device_ids=None, output_device=None, **kwargs):
        if all(p.device.type == "cpu" for p in module.parameters()):
            device_ids = output_device = None
        return ddp(module, *args, device_ids=device_ids, output_device=output_device, **kwargs)

    distributed_data_parallel.resnmt_cpu_ddp = True
    dfm.DistributedDataParallel = distributed_data_parallel
