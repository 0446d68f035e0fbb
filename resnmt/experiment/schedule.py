"""What a training command's schedule amounts to on its data, and what in it cannot train.

``Schedule.of`` reads the schedule from the ``fairseq-train`` flags (the last value of a
flag wins, as in argparse) and counts the updates of one epoch the way ``fairseq-train``
batches the data (``fairseq.data.data_utils.batch_by_size`` over the binarized sizes,
sorted as ``LanguagePairDataset`` sorts them). ``warmup_to_fit`` is the warm-up a preset
scales itself to for a run shorter than its own; ``warnings`` names, one line each, a
schedule that cannot give the model it promises, with the flag and a value that would.
"""
import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

# a preset's warm-up, in a run shorter than it: this share of the run
WARMUP_SHARE = 4


def flag_value(flags: Sequence[str], flag: str, default: Optional[str] = None) -> Optional[str]:
    """The value of ``flag`` among command-line ``flags`` (the last one given), or ``default``."""
    value = default
    for i, arg in enumerate(flags):
        if arg == flag and i + 1 < len(flags):
            value = flags[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def epoch_updates(data: Path, src: str, tgt: str, max_tokens: int, per_update: int) -> Optional[int]:
    """The updates of one epoch of ``data`` (binarized train.SRC-TGT) with batches of
    ``max_tokens``, ``per_update`` batches per update (processes x --update-freq); None
    when the data is not there."""
    import numpy as np
    from fairseq.data import data_utils, indexed_dataset

    prefix = Path(data) / f"train.{src}-{tgt}."
    if not all(indexed_dataset.MMapIndexedDataset.exists(f"{prefix}{lang}") for lang in (src, tgt)):
        return None
    datasets = [indexed_dataset.MMapIndexedDataset(f"{prefix}{lang}") for lang in (src, tgt)]
    src_sizes, tgt_sizes = (np.array(d.sizes, dtype=np.int64) for d in datasets)  # copied: the mmaps close
    order = np.arange(len(src_sizes), dtype=np.int64)
    order = order[np.argsort(tgt_sizes[order], kind="mergesort")]
    order = order[np.argsort(src_sizes[order], kind="mergesort")]
    batches = data_utils.batch_by_size(order, None, max_tokens=max_tokens, required_batch_size_multiple=8,
                                       num_tokens_vec=np.maximum(src_sizes, tgt_sizes)[order])
    return max(1, math.ceil(len(batches) / per_update))


def warmup_to_fit(total: int) -> int:
    """The warm-up of a run of ``total`` updates that is shorter than its preset's warm-up."""
    return max(1, total // WARMUP_SHARE)


@dataclass(frozen=True)
class Schedule:
    """A training run's schedule: its limits, warm-up, checkpoint interval and epoch length."""

    max_update: Optional[int]
    max_epoch: Optional[int]
    warmup: int
    save_interval_updates: int  # 0: epoch checkpoints only
    epoch_updates: Optional[int]  # None: unknown (data not prepared yet)

    @classmethod
    def of(cls, flags: Sequence[str], data: Optional[Path], src: str, tgt: str, processes: int) -> "Schedule":
        def number(flag, default="0"):
            return int(float(flag_value(flags, flag, default)))

        per_update = processes * number("--update-freq", "1")
        tokens = number("--max-tokens")
        epoch = epoch_updates(data, src, tgt, tokens, per_update) if data is not None and tokens else None
        return cls(max_update=number("--max-update") or None, max_epoch=number("--max-epoch") or None,
                   warmup=number("--warmup-updates"), save_interval_updates=number("--save-interval-updates"),
                   epoch_updates=epoch)

    @property
    def total(self) -> Optional[int]:
        """The updates the run will make, where known."""
        by_epoch = self.max_epoch * self.epoch_updates if self.max_epoch and self.epoch_updates else None
        limits = [u for u in (self.max_update, by_epoch) if u]
        return min(limits) if limits else None

    def checkpoints(self, include_last: bool) -> Optional[List[int]]:
        """The updates at which the run saves the checkpoints that are averaged (update
        checkpoints where it saves them, else epoch checkpoints; the last update too with
        ``include_last``), where known."""
        every = self.save_interval_updates or self.epoch_updates
        if not self.total or not every:
            return None
        saved = list(range(every, self.total + 1, every))
        return saved + [self.total] if include_last and (not saved or saved[-1] < self.total) else saved

    def warnings(self, average: Optional[int] = None, include_last: bool = True) -> List[str]:
        """One line for each thing in this schedule that cannot give the model it promises,
        naming the flag and a value that would; ``average``: the checkpoints to average."""
        total, out = self.total, []
        if total and self.warmup >= total:
            out.append(f"--warmup-updates {self.warmup} is not shorter than the run ({total} updates): the learning "
                       f"rate never reaches --lr; use --warmup-updates {warmup_to_fit(total)}, or train longer")
        saved = self.checkpoints(include_last)
        if average and saved is not None and len(saved) < average:
            every = self.save_interval_updates or self.epoch_updates
            unit = "updates" if self.save_interval_updates else "updates (an epoch)"
            first = f", the first at update {saved[0]}" if saved else ""
            out.append(f"--average {average}: this run saves {len(saved)} checkpoint(s) to average, every {every} "
                       f"{unit}{first}, so the average holds models from early in training; use --average "
                       f"{max(1, len(saved) // 2)}, or --max-update {average * every} or more")
        return out
