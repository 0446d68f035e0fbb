#!/usr/bin/env python
"""Your connection kind under the study's protocol, beside the shipped rows: one command.

    python benchmarks/verdict.py layerscale                       # the study's CPU protocol, seed 1
    python benchmarks/verdict.py layerscale --quick               # a first look: 2+2 to 600 updates
    python benchmarks/verdict.py half_post_ln --connections my_kind.py --flags "--my-flag 2" --seeds 1,2

It trains the kind (installed, or named with ``--connections``) as the curves study trains
every row (benchmarks/curves.py: Multi30k EN-DE, 2+2 layers to 2,400 updates and 6+6 to
1,200 at d=128, the study's schedule, checkpoints averaged, test2016 decoded with beam 4,
sacreBLEU), one run per size and seed, each milestone appended to ``--out`` with a progress
line, so that a killed or repeated command resumes where it stopped. It then prints its
BLEU beside the shipped rows' (from the committed benchmarks/results/curves.jsonl, not
retrained): post-LN, pre-LN and the best shipped row at each size's verdict budget, and the
study's verdicts (benchmarks/verdicts.py ``claim_verdict``, paired by seed): above post-LN
at 2+2? above pre-LN at 6+6? level with the best (within the seed spread, 0.5 BLEU)?
``--quick`` trains 2+2 to 600 updates only and says on every line that it is a first
look, not the protocol. The CPU protocol only: the base size has no committed reference
rows yet.
"""
import argparse
import statistics
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import curves
import study
from records import cpu_description, settings_key
from rows import CURVES_ROWS, Row
from study_tables import VERDICT_BUDGETS, runs_of
from verdicts import LEVEL, claim_verdict

from resnmt.experiment.runtime import tool_env
from resnmt.experiment.results import read_jsonl

RESULTS = Path(__file__).resolve().parent / "results" / "curves.jsonl"
SIZE_NAMES = {"small": "2+2", "deep": "6+6"}
PROTOCOL = {"small": (200, 600, 1200, 1800, 2400), "deep": (200, 600, 1200)}  # milestones up to VERDICT_BUDGETS
QUICK = {"small": (200, 600)}
# (size, reference row, question, a claim of matching)
QUESTIONS = (("small", "post_ln", "above post-LN at 2+2", False), ("deep", "pre_ln", "above pre-LN at 6+6", False))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="verdict.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", help="the --residual name of your kind")
    p.add_argument("--flags", default="", help="more fairseq-train flags of the kind, in one string")
    p.add_argument("--connections", help="your kind's module or .py file, when it is not installed")
    p.add_argument("--seeds", default="1", help="comma-separated seeds (default: 1; the study's rows have 1-3)")
    p.add_argument("--quick", action="store_true", help="2+2 to 600 updates only: a first look, not the protocol")
    p.add_argument("--data", default="data/multi30k", help="Multi30k prepared by resnmt-prepare (default: %(default)s)")
    p.add_argument("--workdir", default="runs/verdict", help="checkpoints and logs (default: %(default)s)")
    p.add_argument("--out", default="runs/verdict/curves.jsonl", help="your runs' lines (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of each run (default: 2)")
    p.add_argument("--report", action="store_true", help="print the comparison from --out only, training nothing")
    p.add_argument("--tiny", action="store_true", help="smoke test: the tiny model size (its lines are not the "
                   "study's: the comparison says not measured)")
    return p


def row_name(kind: str, flags: Sequence[str]) -> str:
    return " ".join([kind, *flags])


def study_args(a, milestones: Dict[str, Sequence[int]]):
    """curves.py's arguments as the study ran (its defaults: the same settings key), for this
    command's data, work directory and output."""
    args = curves.parser().parse_args(["--data", a.data, "--workdir", a.workdir, "--out", a.out,
                                       "--threads", str(a.threads), *(["--tiny"] if a.tiny else [])])
    args.workdir, args.out, args.milestones = Path(a.workdir), Path(a.out), {s: list(m) for s, m in milestones.items()}
    return args


def study_key() -> str:
    """The settings key of the CPU study's lines (curves.py's defaults)."""
    return settings_key(curves.study_settings(curves.parser().parse_args([])))


def train(a, row: str, seeds: List[int], milestones: Dict[str, Sequence[int]]) -> None:
    """Each (size, seed) run of ``row`` to its milestones, resuming what is done."""
    args = study_args(a, milestones)
    settings = curves.study_settings(args)
    key = settings_key(settings)
    args.bin_dir, args.ref = curves.flags.scored_corpus(parser(), args.data, args.ref)
    env, device = tool_env(threads=args.threads, cpu_only=True), cpu_description()
    for size in milestones:
        for seed in seeds:
            done = study.done_milestones([args.out], key, "cpu").get((size, row, seed), set())
            lock = study.RunLock(study.run_dir_of(args, key, size, row, seed))
            if not lock.acquire():
                print(f"[verdict] {size} {row} seed {seed}: another copy trains it", file=sys.stderr)
                continue
            try:
                study.score_milestones(args, settings, key, size, row, seed, done, env, device)
            finally:
                lock.release()


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


def report(records: List[dict], reference: List[dict], row: str, milestones: Dict[str, Sequence[int]],
           quick: bool, key: str) -> List[str]:
    """The lines printed: per size, the row beside post-LN, pre-LN and the best shipped row at
    the size's budget, then the verdicts (``claim_verdict``, paired by seed); the lines of
    both with the study's settings ``key`` only."""
    shipped = runs_of(r for r in reference if r.get("settings_key") == key and r.get("device", "cpu") == "cpu")
    ours = runs_of(r for r in records if r.get("settings_key") == key and r["row"] == row)
    label = "QUICK LOOK (2+2 to 600 updates, not the study's protocol): " if quick else ""
    lines = []
    for size, budgets in milestones.items():
        budget = budgets[-1]
        rows, mine = shipped.get(("cpu", size), {}), ours.get(("cpu", size), {})
        best = best_row(rows, budget, row)
        lines.append(f"{label}{SIZE_NAMES[size]} layers, d=128, sacreBLEU at {budget} updates:")
        for name in dict.fromkeys([row, "post_ln", "pre_ln", best]):
            values = bleu_at(mine if name == row else rows, name, budget)
            tag = "  (yours)" if name == row else "  (best shipped)" if name == best else ""
            lines.append(f"  {name:28s} {cell(list(values.values()))}{tag}")
        questions = [(ref, q, level) for s, ref, q, level in QUESTIONS if s == size]
        if best:
            questions.append((best, f"level with the best shipped row ({best}, within {LEVEL} BLEU)", True))
        for ref, question, level in questions:
            lines.append(f"{label}{question}? {verdict(mine, rows, row, ref, budget, level)}")
    return lines


def verdict(mine: dict, rows: dict, row: str, ref: str, budget: int, at_least: bool) -> str:
    """``claim_verdict`` of ``row`` minus ``ref`` at ``budget``, paired by seed (a seed the
    reference lacks is compared with the reference's seed 1)."""
    ours, theirs = bleu_at(mine, row, budget), bleu_at(rows, ref, budget)
    if not ours or not theirs:
        return "not measured yet" if not ours else f"no {ref} row at {budget} updates"
    diffs = [value - theirs.get(seed, theirs[min(theirs)]) for seed, value in sorted(ours.items())]
    spread = ", ".join(f"{d:+.2f}" for d in diffs)
    return f"{claim_verdict(diffs, at_least=at_least)} ({spread})"


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    flags = a.flags.split() + (["--connections", a.connections] if a.connections else [])
    try:
        seeds = sorted({int(s) for s in a.seeds.split(",") if s.strip()})
    except ValueError:
        p.error(f"--seeds {a.seeds!r}: expected comma-separated integers, e.g. 1,2")
    if not seeds or min(seeds) < 1:
        p.error(f"--seeds {a.seeds!r}: expected seeds >= 1, e.g. 1,2")
    row = row_name(a.kind, a.flags.split())
    milestones = QUICK if a.quick else PROTOCOL
    assert all(ms[-1] == VERDICT_BUDGETS[s] for s, ms in PROTOCOL.items())
    if row in CURVES_ROWS:
        p.error(f"{a.kind}: a shipped row of the study has this name; its numbers are in {RESULTS}")
    CURVES_ROWS[row] = Row("resnmt_transformer", ("--residual", a.kind, *flags), seeds=len(seeds))
    if not a.report:
        train(a, row, seeds, milestones)
    print("\n".join(report(read_jsonl(a.out), read_jsonl(RESULTS), row, milestones, a.quick, study_key())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
