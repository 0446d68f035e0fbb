"""A connection kind's verdict against the study: its protocols (what ``resnmt-study verdict``
trains: the CPU study's sizes and budgets, a quick first look, the GPU study's base size, a
smoke test) and its report, the kind's sacreBLEU beside the shipped rows' (post-LN, pre-LN
and the best of them at each size's budget) with the study's verdicts
(:mod:`resnmt.study.verdicts`, paired by seed).
"""
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from resnmt.study.lines import SIZE_SHORT, VERDICT_BUDGETS, runs_of
from resnmt.study.verdicts import LEVEL, VERDICT_SEEDS, claim_verdict, level_verdict


@dataclass(frozen=True)
class Protocol:
    """What a verdict trains on one device: each size's milestones (the last: its budget),
    those of the quick first look, the questions asked (size, reference row, question), the
    run options that make its settings (beside the study's defaults) and its schedule
    (peak learning rate, warm-up updates; None: the study's defaults)."""

    device: str
    milestones: Dict[str, Tuple[int, ...]]
    quick: Dict[str, Tuple[int, ...]]
    questions: Tuple[Tuple[str, str, str], ...]
    run_flags: Tuple[str, ...] = ()
    schedule: Tuple[float, int] = None


# The shipped rows a verdict compares with: the study's lines of the protocols' settings,
# installed with the package.
REFERENCE = Path(__file__).with_name("reference.jsonl")

# The CPU study: 2+2 and 6+6 layers at d=128, each to the budget its verdict is read at.
CPU = Protocol(
    "cpu", {"small": (200, 600, 1200, 1800, 2400), "deep": (200, 600, 1200)}, {"small": (200, 600)},
    (("small", "post_ln", "above post-LN at 2+2"), ("deep", "pre_ln", "above pre-LN at 6+6")))
assert all(ms[-1] == VERDICT_BUDGETS[size] for size, ms in CPU.milestones.items())
# The GPU study's base size (6+6, d=512): its milestones, a checkpoint every 100 updates,
# the attention kernels it trains with, and its schedule (inverse square root, peak 5e-4,
# 4000 warm-up updates: the study's choice from a sweep of post-LN at this size).
CUDA = Protocol(
    "cuda", {"base": (1000, 2000, 3000, 4000)}, {"base": (1000,)},
    (("base", "post_ln", "above post-LN at 6+6, d=512"), ("base", "pre_ln", "above pre-LN at 6+6, d=512")),
    ("--device", "cuda", "--save-every", "100", "--sdpa-backends", "flash,efficient,math"), (5e-4, 4000))
PROTOCOLS = {p.device: p for p in (CPU, CUDA)}
# The smoke test (--tiny): the tiny model to a few updates, on any corpus; its rows are set
# beside the shipped rows at the quick look's budget, and every verdict line says so.
TINY_MILESTONES = {"small": (2,)}
TINY_FLAGS = ("--tiny", "--save-every", "1", "--average", "2", "--warmup", "1", "--max-tokens", "300",
              "--analyze-sentences", "8")


def label(protocol: Protocol, milestones: dict, tiny: bool) -> str:
    """What every verdict line of a run that is not the protocol starts with ("" for the protocol)."""
    if tiny:
        size, ms = next(iter(milestones.items()))
        return (f"SMOKE TEST (the tiny model to {ms[-1]} updates beside the shipped rows at "
                f"{protocol.quick[size][-1]}: not the study's protocol): ")
    if milestones == protocol.quick:
        size, ms = next(iter(milestones.items()))
        return f"QUICK LOOK ({SIZE_SHORT[size]}, to {ms[-1]} updates: not the study's protocol): "
    return ""


def by_size(records, key: str, device: str) -> dict:
    """{size: {row: {seed: {updates: line}}}} of the curves lines with settings ``key`` on ``device``."""
    chosen = [r for r in records if r.get("settings_key") == key and r.get("device", "cpu") == device]
    return {size: rows for (_, size), rows in runs_of(chosen).items()}


def bleu_at(rows: dict, row: str, updates: int) -> Dict[int, float]:
    """{seed: sacreBLEU} of ``row`` at ``updates``."""
    return {seed: recs[updates]["bleu"] for seed, recs in rows.get(row, {}).items() if updates in recs}


def cell(values: Sequence[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f} (1 seed)"
    return f"{statistics.mean(values):.2f} ({min(values):.2f}-{max(values):.2f}, {len(values)} seeds)"


def best_row(rows: dict, updates: int, exclude: str) -> str:
    """The shipped row with the highest mean sacreBLEU at ``updates``."""
    means = {row: statistics.mean(v.values()) for row in rows if row != exclude
             for v in [bleu_at(rows, row, updates)] if v}
    return max(means, key=means.get) if means else ""


def seeds_text(seeds) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def compared(ours: Dict[int, float], theirs: Dict[int, float]) -> Tuple[List[float], str]:
    """The differences the verdict rule reads (``ours`` minus ``theirs``, {seed: BLEU}) and
    what they are: paired by seed over the seeds both have (named); where they share none,
    the mean of ours against the mean of theirs (said so, with each side's seeds)."""
    common = sorted(set(ours) & set(theirs))
    if common:
        return [ours[s] - theirs[s] for s in common], f"paired by seed: {seeds_text(common)}"
    return ([statistics.mean(ours.values()) - statistics.mean(theirs.values())],
            f"mean against mean, no seed in common: yours {seeds_text(sorted(ours))}, "
            f"the reference's {seeds_text(sorted(theirs))}")


def verdict(ours: Dict[int, float], theirs: Dict[int, float], ref: str, budget: int, level: bool,
            protocol: bool = True) -> str:
    """One question's answer: ``claim_verdict`` (``level``: ``level_verdict``) of the
    differences :func:`compared` gives, those differences, what they are, how many seeds
    stand behind them and whether the study's rule calls that a verdict (the protocol's
    budget, :data:`VERDICT_SEEDS` seeds paired) or a first look (``protocol`` False: a
    quick look or a smoke test)."""
    if not ours or not theirs:
        return "not measured yet" if not ours else f"no {ref} row at {budget} updates"
    diffs, what = compared(ours, theirs)
    word = level_verdict(diffs) if level else claim_verdict(diffs).split(" ")[0]
    paired = what.startswith("paired")
    n = len(diffs) if paired else len(ours)
    weight = "a verdict" if protocol and paired and n >= VERDICT_SEEDS else "a first look"
    spread = ", ".join(f"{d:+.2f}" for d in diffs)
    return f"{word}: {spread} ({what}; {n} seed{'s' if n > 1 else ''}: {weight})"


def missing_reference(sizes, device: str, shipped: dict) -> str:
    """The one line that replaces the comparison where the reference lines hold no row of
    one of ``sizes`` ("" where they all have rows)."""
    missing = [size for size in sizes if not shipped.get(size)]
    if not missing:
        return ""
    return (f"no reference rows at {' and '.join(SIZE_SHORT[s] for s in missing)} ({device}, the study's settings "
            "for it) yet: no comparison (your lines are kept; --report compares them once the study has its rows)")


def report(records: List[dict], reference: List[dict], row: str, protocol: Protocol, milestones: dict,
           keys: Tuple[str, str], tiny: bool = False) -> List[str]:
    """The lines printed: per size, ``row`` at its last milestone beside post-LN, pre-LN and
    the best shipped row at the same budget (a smoke test: at the quick look's), then the
    verdicts; ``keys``: the settings keys of the kind's lines and of the reference lines."""
    shipped = by_size(reference, keys[1], protocol.device)
    ours = by_size([r for r in records if r["row"] == row], keys[0], protocol.device)
    tag, lines = label(protocol, milestones, tiny), []
    gap = missing_reference(milestones, protocol.device, shipped)
    if gap:
        return [tag + gap]
    for size, budgets in milestones.items():
        budget = protocol.quick[size][-1] if tiny else budgets[-1]
        rows, mine = shipped.get(size, {}), bleu_at(ours.get(size, {}), row, budgets[-1])
        best = best_row(rows, budget, row)
        lines.append(f"{tag}{SIZE_SHORT[size]}, sacreBLEU at {budget} updates:")
        lines.append(f"  {row:28s} {cell(list(mine.values()))}  (yours{', at ' + str(budgets[-1]) if tiny else ''})")
        for name in dict.fromkeys(["post_ln", "pre_ln", best]):
            tail = "  (best shipped)" if name == best else ""
            lines.append(f"  {name:28s} {cell(list(bleu_at(rows, name, budget).values()))}{tail}")
        questions = [(ref, q, False) for s, ref, q in protocol.questions if s == size]
        if best:
            questions.append((best, f"level with the best shipped row ({best}, within ±{LEVEL} BLEU)", True))
        for ref, question, level in questions:
            answer = verdict(mine, bleu_at(rows, ref, budget), ref, budget, level, protocol=not tag)
            lines.append(f"{tag}{question}? {answer}")
    return lines
