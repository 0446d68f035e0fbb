"""What a verdict will cost, said before it trains: the runs, the updates still to train and
the time they take on this machine at a rate measured there (a few updates of the kind's own
model at each size, on the corpus, as fairseq-train makes them), and what a quick look or a
smoke test leaves out of the protocol.
"""
import time
from typing import Dict, Optional, Sequence

from resnmt.experiment.presets import ModelSize
from resnmt.progress import format_seconds
from resnmt.study.lines import SIZE_SHORT

WARMUP_UPDATES, TIMED_UPDATES = 1, 3  # the first update (allocation, kernel choice) is not timed


def measured_rate(bin_dir, arch: str, flags: Sequence[str], size: ModelSize, *, max_tokens: int, lr: float,
                  threads: int, device: str = "cpu", updates: int = TIMED_UPDATES) -> float:
    """Updates per second of ``arch`` with ``flags`` at ``size`` on the corpus ``bin_dir``:
    fairseq's model, criterion and batches of ``max_tokens`` (the study's), Adam, ``updates``
    timed after :data:`WARMUP_UPDATES`, on ``threads`` torch threads (the runs'), on ``device``."""
    import torch
    from fairseq import options, tasks

    argv = [str(bin_dir), "--arch", arch, *size.fairseq_flags(), "--share-all-embeddings", *flags,
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", str(max_tokens),
            "--seed", "1", "--num-workers", "0"]
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=argv)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        task = tasks.setup_task(args)
        task.load_dataset("train")
        model, criterion = task.build_model(args).to(device).train(), task.build_criterion(args).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
        epochs = task.get_batch_iterator(task.dataset("train"), max_tokens=max_tokens, seed=1)
        started, done = None, 0
        while done < WARMUP_UPDATES + updates:  # a small corpus: more than one epoch
            for sample in epochs.next_epoch_itr(shuffle=True):
                if done == WARMUP_UPDATES:
                    started = time.perf_counter()
                sample = move(sample, device)
                optimizer.zero_grad()
                loss, _, _ = criterion(model, sample)
                loss.backward()
                optimizer.step()
                done += 1
                if done == WARMUP_UPDATES + updates:
                    break
        if device == "cuda":
            torch.cuda.synchronize()
        return updates / (time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads_before)


def move(sample, device: str):
    if device == "cpu":
        return sample
    from fairseq import utils

    return utils.move_to_cuda(sample)


def cost_line(todo: Dict[tuple, int], rates: Optional[Dict[str, float]], milestones: Dict[str, Sequence[int]]) -> str:
    """The cost of ``todo`` ({(size, seed): updates still to train}) at ``rates`` ({size:
    updates per second}; None: not measured): runs, updates, the time, and the milestones
    each adds decoding at."""
    runs = [run for run, left in todo.items() if left > 0]
    if not runs:
        return f"cost: nothing left to train ({len(todo)} run{'s' if len(todo) > 1 else ''} done)"
    scored = sum(len(milestones[size]) for size, _ in runs)
    head = f"cost: {len(runs)} run{'s' if len(runs) > 1 else ''} to train, {sum(todo.values())} updates"
    tail = f"plus decoding and scoring test2016 at {scored} milestone{'s' if scored > 1 else ''}"
    if rates is None:
        return f"{head} (no time: no device of the runs' kind here to measure a rate on), {tail}"
    seconds = sum(left / rates[size] for (size, _), left in todo.items() if left > 0)
    measured = ", ".join(f"{SIZE_SHORT.get(size, size)} at {rates[size]:.2f} updates/s" for size in rates)
    return (f"{head}, about {format_seconds(seconds)} of training on this machine (measured here: {measured}, over "
            f"{TIMED_UPDATES} updates each), {tail}")


def left_out(full: Dict[str, Sequence[int]], chosen: Dict[str, Sequence[int]], what: str) -> str:
    """What ``chosen`` (a quick look's or a smoke test's milestones) leaves out of the
    protocol's ``full`` milestones, in one line ("" where it leaves nothing out)."""
    parts = []
    for size, ms in full.items():
        if size not in chosen:
            parts.append(f"the {SIZE_SHORT[size]} runs (to {ms[-1]} updates)")
        elif chosen[size][-1] < ms[-1]:
            parts.append(f"{SIZE_SHORT[size]} from {chosen[size][-1]} to {ms[-1]} updates")
    if not parts:
        return ""
    return f"{what} leaves out {' and '.join(parts)}: no verdict of the protocol's is read from it, a first look only"
