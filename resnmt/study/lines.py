"""Reading the study's lines (``curves`` JSON lines, one per run and milestone): where and
how a line was trained (its setting: the device, and where they differ from the study's,
the schedule, the fast path, bf16 and the language pair), the lines grouped by setting,
size, row, seed and milestone, each size's title and the budget its verdict is read at.
"""
from collections import defaultdict

from resnmt.data.corpora import DATASETS
from resnmt.study.flags import STUDY_LR, STUDY_WARMUP

SIZE_TITLES = {"small": "2+2 layers, d=128", "deep": "6+6 layers, d=128", "base": "6+6 layers, d=512",
               "base12": "12+12 layers, d=512"}
SIZE_SHORT = {"small": "2+2, d=128", "deep": "6+6, d=128", "base": "6+6, d=512", "base12": "12+12, d=512"}
# The budget each CPU size's verdict is read at (updates): the 2+2 runs' where the study's
# claims are read, the 6+6 runs' the last most seeds reach.
VERDICT_BUDGETS = {"small": 2400, "deep": 1200}

# The study's own language pair: its settings are named without it (``"cpu"``); another
# pair's name it (``"cpu, Multi30k EN-FR"``).
MAIN_PAIR = "en-de"


def pair_of(record) -> str:
    """The language pair a curves line was trained on (``"en-fr"``): its corpus's, by the
    dataset its settings name (resnmt.data.corpora)."""
    dataset = DATASETS[record.get("settings", {}).get("corpus", "multi30k")]
    return f"{dataset.src}-{dataset.tgt}"


def pair_title(pair: str) -> str:
    """``"en-fr"`` -> ``"Multi30k EN-FR"``."""
    return f"Multi30k {pair.upper()}"


def setting_of(record) -> str:
    """Where and how a curves line was trained, as its panels and tables name it: the device
    (cpu, cuda), and where they are not the CPU study's, the schedule, the fast path, bf16 and
    the language pair (``"cuda, lr 0.0007, warm-up 2000, bf16"``, ``"cpu, Multi30k EN-FR"``):
    lines of another schedule, precision or pair are other runs."""
    s = record.get("settings", {})
    where = record.get("device", "cpu")
    if (s.get("lr", STUDY_LR), s.get("warmup_updates", STUDY_WARMUP)) != (STUDY_LR, STUDY_WARMUP):
        where += f", lr {s['lr']:g}, warm-up {s['warmup_updates']}"
    pair = pair_of(record)
    where += (", fast path" if s.get("fast_path") else "") + (f", {s['dtype']}" if s.get("dtype") else "")
    return where + (f", {pair_title(pair)}" if pair != MAIN_PAIR else "")


def runs_of(records):
    """{(setting, size): {row: {seed: {updates: record}}}} of the curves lines among
    ``records``; the setting is :func:`setting_of`'s (``cpu``, ``cuda`` for the CPU study's
    schedule)."""
    runs = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in records:
        if r.get("benchmark") == "curves":
            runs[(setting_of(r), r["size"]["name"])][r["row"]][r["seed"]][r["updates"]] = r
    return runs
