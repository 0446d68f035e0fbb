"""The curves study's tables and verdicts, from ``benchmarks/results/curves.jsonl``
(written by ``benchmarks/curves.py``): sacreBLEU per row and budget, each row's difference
from its reference row paired by seed, the results at a glance (the papers' claims and
whether they hold) and the cross-layer methods' verdicts. benchmarks/make_tables.py writes
them into the documents; benchmarks/plot_curves.py draws the figures of the same runs.
"""
import statistics
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from resnmt.experiment.results import read_jsonl
from resnmt.study.lines import (MAIN_PAIR, SIZE_SHORT, SIZE_TITLES, VERDICT_BUDGETS, pair_of,  # noqa: F401
                                pair_title, runs_of, setting_of)
from resnmt.study.verdicts import LEVEL, claim_verdict

from campaign.rows import CONTROLS, GEN2025_KINDS, GEN2025_VARIANTS, NEW_KINDS, SAME_RUN

MARKERS = {
    "curves-table": ("<!-- curves-table:begin -->", "<!-- curves-table:end -->"),
    "glance-table": ("<!-- glance-table:begin -->", "<!-- glance-table:end -->"),
    "cross-layer-table": ("<!-- cross-layer-table:begin -->", "<!-- cross-layer-table:end -->"),
    "gen2025-table": ("<!-- gen2025-table:begin -->", "<!-- gen2025-table:end -->"),
    "pairs-table": ("<!-- pairs-table:begin -->", "<!-- pairs-table:end -->"),
    "pairs-glance": ("<!-- pairs-glance:begin -->", "<!-- pairs-glance:end -->"),
}


def load(path: Path):
    """{(device, size): {row: {seed: {updates: record}}}} of the curves lines in ``path``."""
    return runs_of(read_jsonl(path))


def of_main_pair(setting: str) -> bool:
    """Whether a setting (:func:`setting_of`) is of the study's own pair: only another pair's is named in it."""
    return "Multi30k" not in setting


def titled(setting: str) -> str:
    """A setting as a table's or a figure's title names it, its language pair always said."""
    return f"{setting}, {pair_title(MAIN_PAIR)}" if of_main_pair(setting) else setting


def ordered_keys(runs):
    """(device, size) keys: by device, then sizes in SIZE_TITLES order."""
    return sorted(runs, key=lambda k: (k[0], list(SIZE_TITLES).index(k[1]) if k[1] in SIZE_TITLES else len(SIZE_TITLES)))


def bleu_table(runs) -> str:
    """sacreBLEU per row and milestone (mean ± std over seeds), per device and size."""
    lines = []
    for device, size in ordered_keys(runs):
        rows = runs[(device, size)]
        milestones = sorted({u for seeds in rows.values() for recs in seeds.values() for u in recs})
        lines += [f"**{SIZE_TITLES.get(size, size)} ({titled(device)})**: sacreBLEU mean ± std over seeds (n seeds)", "",
                  "| row | " + " | ".join(str(u) for u in milestones) + " |",
                  "|---|" + "---:|" * len(milestones)]
        for row, seeds in sorted(rows.items()):
            cells = []
            for u in milestones:
                vals = [recs[u]["bleu"] for recs in seeds.values() if u in recs]
                if not vals:
                    cells.append("")
                elif len(vals) == 1:
                    cells.append(f"{vals[0]:.2f} (1)")
                else:
                    cells.append(f"{statistics.mean(vals):.2f} ± {statistics.stdev(vals):.2f} ({len(vals)})")
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _mean_std(values, count: bool = True) -> str:
    """Signed mean ± std of ``values`` (the value alone for one), then ``(n)`` if ``count``."""
    text = (f"{values[0]:+.2f}" if len(values) == 1
            else f"{statistics.mean(values):+.2f} ± {statistics.stdev(values):.2f}")
    return f"{text} ({len(values)})" if count else text


def reference_row(row: str, baseline: str = "post_ln") -> str:
    """The row that ``row`` is compared with: ``baseline`` in the shared settings; for a
    control, ``baseline``'s control with the same changed flags (rSkip with a 1000-update
    warm-up against post-LN with a 1000-update warm-up), where there is one."""
    changed = CONTROLS[row].flags if row in CONTROLS else ()
    same_setting = next((name for name, c in CONTROLS.items() if c.row == baseline and c.flags == changed), None)
    return same_setting if changed and same_setting not in (None, row) else baseline


def paired_differences(rows: dict, row: str, baseline: str = "post_ln") -> dict:
    """{seed: {updates: row's sacreBLEU minus its reference's}} for the seeds and budgets
    that both have (empty when the reference row is missing)."""
    base = rows.get(reference_row(row, baseline), {})
    diffs = {seed: {u: r["bleu"] - base[seed][u]["bleu"] for u, r in recs.items() if u in base.get(seed, {})}
             for seed, recs in rows.get(row, {}).items()}
    return {seed: per_update for seed, per_update in diffs.items() if per_update}


def difference_table(runs, baseline: str = "post_ln") -> str:
    """Each row's sacreBLEU minus its reference's (:func:`reference_row`), per milestone,
    paired by seed (only seeds that both have at that milestone): mean ± std over seeds (n)."""
    lines = []
    for device, size in ordered_keys(runs):
        rows = runs[(device, size)]
        others = [r for r in sorted(rows) if r != baseline and reference_row(r, baseline) in rows]
        if not others:
            continue
        milestones = sorted({u for r in {baseline, *map(reference_row, others)} for recs in rows.get(r, {}).values()
                             for u in recs})
        lines += [f"**{SIZE_TITLES.get(size, size)} ({titled(device)})**: sacreBLEU minus the reference row's, paired by seed, "
                  "mean ± std (n seeds)", "",
                  "| row | minus | " + " | ".join(str(u) for u in milestones) + " |",
                  "|---|---|" + "---:|" * len(milestones)]
        for row in others:
            diffs = paired_differences(rows, row, baseline)
            cells = [_mean_std([d[u] for d in diffs.values() if u in d]) if any(u in d for d in diffs.values()) else ""
                     for u in milestones]
            lines.append(f"| {row} | {reference_row(row, baseline)} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


class Claim(NamedTuple):
    """One row of the results-at-a-glance table: a paper's claim, measured as ``row`` minus
    its reference row (``reference``, else :func:`reference_row`), paired by seed, at
    ``updates`` updates; a claim of matching (``at_least``) holds within :data:`verdicts.LEVEL`."""
    claim: str
    papers: str
    device: str
    size: str
    row: str
    updates: int
    note: str = ""
    reference: str = ""
    at_least: bool = False
    method: str = ""  # the glance table's row: claims of one method share it (default: the claim's own)


# The papers' numbers are IWSLT'15 EN-VI BLEU at base size, trained to convergence; the
# study's are Multi30k EN-DE sacreBLEU, so only the direction compares. The 2+2 rows are
# measured at the final budget; the 6+6 rows at the last budget most of their seeds reach.
CLAIMS = (
    Claim("SAS > post-LN", "32.0 vs 30.9", "cpu", "small", "sas", 14400,
          "half the paper's gain, at the final budget only", method="SAS"),
    Claim("rSkip+LN λ=2 > post-LN", "30.49 vs 30.04 (2 layers)", "cpu", "small", "rskip_ln (λ=2)", 14400,
          "higher training loss: fits less", method="rSkip+LN"),
    Claim("xSkip+LN λ=2 > post-LN", "30.99 vs 30.31", "cpu", "small", "xskip_ln (λ=2)", 14400, method="xSkip+LN"),
    Claim("rSkip+LN λ=2 > post-LN", "31.45 vs 30.31", "cuda", "deep", "rskip_ln (λ=2)", 2400,
          "but pre-LN repairs post-LN as much", method="rSkip+LN"),
    Claim("SAS > post-LN", "32.0 vs 30.9", "cpu", "deep", "sas", 2400, "as much as pre-LN", method="SAS"),
    Claim("(control) pre-LN > post-LN", "—", "cpu", "deep", "pre_ln", 2400, method="pre-LN"),
    Claim("DeepNorm > post-LN", "— (stable deep training)", "cpu", "deep", "deepnorm", 2400, method="DeepNorm"),
    Claim("Admin > post-LN", "— (stable deep training)", "cpu", "deep", "admin", 2400, method="Admin"),
    Claim("ReZero > post-LN", "— (faster convergence, in LM)", "cpu", "deep", "rezero", 2400,
          "but the slowest of the repairs", method="ReZero"),
    Claim("rSkip+LN λ=2 > post-LN, both warm-up 1000", "31.45 vs 30.31", "cuda", "base",
          "rskip_ln (λ=2, warm-up 1000)", 3600, "post-LN diverges with 300 warm-up updates", method="rSkip+LN"),
    # The methods that cross layers: their papers report WMT EN-DE at 18+ layers, no
    # shallow or EN-VI number; each claims post-LN's quality with pre-LN's stability.
    Claim("B2T ≥ post-LN (post-LN's quality)", "— (WMT EN-DE 18+18: 28.48)", "cpu", "small", "b2t", 2400,
          "not above pre-LN either", at_least=True, method="B2T"),
    Claim("B2T > post-LN (pre-LN's stability)", "— (WMT EN-DE 18+18: 28.48)", "cpu", "deep", "b2t", 1200,
          "ahead of pre-LN too", method="B2T"),
    Claim("ResiDual ≥ post-LN (post-LN's quality)", "— (WMT EN-DE, deep)", "cpu", "small", "resi_dual", 2400,
          at_least=True, method="ResiDual"),
    Claim("ResiDual > post-LN (pre-LN's stability)", "— (WMT EN-DE, deep)", "cpu", "deep", "resi_dual", 1200,
          "but 4 BLEU behind pre-LN", method="ResiDual"),
    Claim("DLCL ≥ post-LN", "— (WMT EN-DE 30 layers: 29.3 vs base 27.3)", "cpu", "small", "dlcl", 2400,
          at_least=True, method="DLCL"),
    Claim("DLCL > post-LN", "— (WMT EN-DE 30 layers: 29.3 vs base 27.3)", "cpu", "deep", "dlcl", 1200,
          "level with pre-LN", method="DLCL"),
    Claim("DLCL-post ≥ post-LN", "— (WMT EN-DE 25 layers: 29.2 vs base 27.3)", "cpu", "small", "dlcl_post", 2400,
          "level with pre-LN", at_least=True, method="DLCL-post"),
    Claim("DLCL-post > post-LN", "— (WMT EN-DE 25 layers: 29.2 vs base 27.3)", "cpu", "deep", "dlcl_post", 1200,
          "ahead of pre-LN too", method="DLCL-post"),
    Claim("Peri-LN ≥ post-LN", "— (language models only)", "cpu", "small", "peri_ln", 2400, "below pre-LN too",
          at_least=True, method="Peri-LN"),
    Claim("Peri-LN > post-LN", "— (language models only)", "cpu", "deep", "peri_ln", 1200,
          "but 3 BLEU behind pre-LN", method="Peri-LN"),
    # The normalizations, each against LayerNorm in the same place.
    *(Claim(f"{name} ≥ LayerNorm ({place})", papers, "cpu", size, f"{row} + {norm}", budget,
            {("dyt", "post_ln"): "the gradient vanishes through post-LN's DyTs",
             ("dyt", "pre_ln"): "stable, at about half pre-LN's pace"}.get((norm, row), ""),
            reference=row, at_least=True, method=name)
      for name, norm, papers in (("RMSNorm", "rms_norm", "— (on par with LayerNorm, faster)"),
                                 ("DyT", "dyt", "— (matches LayerNorm; no MT result)"))
      for place, row in (("pre-LN", "pre_ln"), ("post-LN", "post_ln"))
      for size, budget in (("small", 2400), ("deep", 1200))),
    # The 2025 generation: each paper reports a gain over pre-LN in language models (or
    # vision), none in translation. Mix-LN at 2+2 is pre-LN's run (rows.SAME_RUN).
    *(Claim(f"{name} > pre-LN", papers, "cpu", size, row, budget, reference="pre_ln", method=name)
      for name, row, papers in (("Hyper-Connections", "hyper", "— (OLMo-1B loss 2.811 → 2.791, static ×4)"),
                                ("mHC", "mhc", "— (27B MoE loss −0.021)"),
                                ("Mix-LN", "mix_ln", "— (LLaMA-1B C4 ppl 18.65 → 18.18)"),
                                ("LayerNorm Scaling", "ln_scaling", "— (LLaMA-1B C4 ppl 17.02 → 15.71)"),
                                ("HybridNorm", "hybrid_norm", "— (550M C4 ppl 20.30 → 20.00)"),
                                ("DenseFormer", "denseformer", "— (language models only)"))
      for size, budget in (("small", 2400), ("deep", 1200)) if (size, row) not in SAME_RUN),
)


def glance_table(runs, claims=CLAIMS, baseline: str = "post_ln") -> str:
    """Results at a glance, one row per method: per claim (a line of the row), the setting,
    the paper's number, the row's and its reference's sacreBLEU over the seeds both have at
    the claim's budget (mean ± std), their paired difference with n, and a verdict from
    the seeds' signs (:func:`verdicts.claim_verdict`). Claims not measured yet are left out."""
    lines = ["| method | claim | setting | papers | measured (Multi30k EN-DE): row vs reference, difference "
             "(n seeds) | holds? |", "|---|---|---|---|---|---|"]
    methods = {}
    for c in claims:
        rows = runs.get((c.device, c.size), {})
        base = c.reference or baseline
        ref = reference_row(c.row, base)  # the row paired_differences subtracts
        diffs = {seed: d[c.updates] for seed, d in paired_differences(rows, c.row, base).items() if c.updates in d}
        if not diffs:
            continue
        seeds = sorted(diffs)
        own = [rows[c.row][s][c.updates]["bleu"] for s in seeds]
        other = [rows[ref][s][c.updates]["bleu"] for s in seeds]

        def mean_std(values):
            return (f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1
                    else f"{values[0]:.2f}")

        measured = f"{mean_std(own)} vs {mean_std(other)}, {_mean_std([diffs[s] for s in seeds])}"
        setting = f"{SIZE_SHORT.get(c.size, c.size)}, {c.updates} updates{', GPU' if c.device.startswith('cuda') else ''}"
        answer = claim_verdict([diffs[s] for s in seeds], c.at_least) + (f"; {c.note}" if c.note else "")
        methods.setdefault(c.method or c.claim, []).append((c.claim, setting, c.papers, measured, answer))
    for method, cells in methods.items():
        columns = [list(column) for column in zip(*cells)]
        for k in (0, 2):  # the same claim, the same paper's number for every line: once
            if len(set(columns[k])) == 1:
                columns[k] = columns[k][:1]
        lines.append(f"| {method} | " + " | ".join("<br>".join(column) for column in columns) + " |")
    return "\n".join(lines)


def last_shared(rows: dict, row: str, other: str, seed: int = 1, upto: float = float("inf")):
    """The newest budget up to ``upto`` that ``row`` and ``other`` have both reached with
    ``seed`` (None if none)."""
    shared = {u for u in set(rows.get(row, {}).get(seed, {})) & set(rows.get(other, {}).get(seed, {})) if u <= upto}
    return max(shared) if shared else None


def _gap(rows: dict, row: str, other: str, upto: float = float("inf")):
    """(the differences, the budget, its cell) at the newest budget up to ``upto`` both rows
    reached with seed 1: ``row`` minus ``other`` for every seed both have there, paired by
    seed; the cell is the difference (one seed) or the mean ± std (n) over the seeds."""
    u = last_shared(rows, row, other, upto=upto)
    if u is None:
        return [], None, ""
    diffs = [recs[u]["bleu"] - rows[other][seed][u]["bleu"] for seed, recs in sorted(rows[row].items())
             if u in recs and u in rows[other].get(seed, {})]
    return diffs, u, f"{_mean_std(diffs, count=False)} @ {u}" + (f" ({len(diffs)} seeds)" if len(diffs) > 1 else "")


# The budgets a verdict waits for: 2+2 post-LN and pre-LN differ from 2400 updates on;
# 6+6 post-LN is far behind every repair from 1200 on.


def cross_layer_table(runs, rows=NEW_KINDS) -> str:
    """Per method of ``rows`` (at the newest budget seed 1 of both rows reached, up to the
    verdict budget, so that every method is judged at the same one; paired by seed over
    every seed both have there): does it get post-LN's quality at 2+2 layers
    (sacreBLEU minus post-LN's) and pre-LN's stability at 6+6 (minus pre-LN's, and minus
    post-LN's)? A gap within :data:`verdicts.LEVEL` BLEU counts as level: one seed cannot
    resolve less (the 2+2 seeds of one row differ by 0.3-0.6); with several seeds the verdict
    is :func:`verdicts.claim_verdict`'s (``mixed`` where the seeds disagree). Before
    ``VERDICT_BUDGETS`` the verdict is "not yet". A row whose run is another row's, bit for bit
    (``rows.SAME_RUN``), is read from that run and says so."""
    small, deep = runs.get(("cpu", "small"), {}), runs.get(("cpu", "deep"), {})
    lines = ["| method | 2+2: − post-LN | 6+6: − pre-LN | 6+6: − post-LN | post-LN's 2+2 quality? | "
             "pre-LN's 6+6 stability? |", "|---|---:|---:|---:|---|---|"]

    def judged(diffs, u, size):
        if not diffs:
            return "—"
        if u < VERDICT_BUDGETS[size]:
            return "not yet"
        return claim_verdict(diffs, at_least=True).replace(" (1 seed)", "")

    for row in rows:
        same = SAME_RUN.get(("small", row)) if row not in small else None
        if row not in small and row not in deep and same is None:
            continue
        d_small, u_small, small_cell = _gap(small, same or row, "post_ln", VERDICT_BUDGETS["small"])
        if same is not None and small_cell:
            small_cell += f" (= {same}: the same run)"
        d_deep, u_deep, deep_cell = _gap(deep, row, "pre_ln", VERDICT_BUDGETS["deep"])
        deep_post_cell = _gap(deep, row, "post_ln", VERDICT_BUDGETS["deep"])[2]
        lines.append(f"| {row} | {small_cell} | {deep_cell} | {deep_post_cell} | {judged(d_small, u_small, 'small')} | "
                     f"{judged(d_deep, u_deep, 'deep')} |")
    return "\n".join(lines)


class PairClaim(NamedTuple):
    """A positive claim of the study, repeated on a second language pair: ``row`` minus
    ``reference`` at ``size``'s verdict budget (:data:`VERDICT_BUDGETS`), paired by seed."""
    claim: str
    size: str
    row: str
    reference: str


# The claims the study found to hold (or, for post-LN at 6+6, to fail) on EN-DE: the kinds
# ahead of post-LN at 2+2, and those ahead of pre-LN (or repairing post-LN) at 6+6.
PAIR_CLAIMS = (
    PairClaim("Hyper-Connections > post-LN", "small", "hyper", "post_ln"),
    PairClaim("HybridNorm > post-LN", "small", "hybrid_norm", "post_ln"),
    PairClaim("Hyper-Connections > pre-LN", "small", "hyper", "pre_ln"),
    PairClaim("HybridNorm > pre-LN", "small", "hybrid_norm", "pre_ln"),
    PairClaim("pre-LN > post-LN", "deep", "pre_ln", "post_ln"),
    PairClaim("rSkip+LN λ=2 > post-LN", "deep", "rskip_ln (λ=2)", "post_ln"),
    PairClaim("rSkip+LN λ=2 > pre-LN", "deep", "rskip_ln (λ=2)", "pre_ln"),
    PairClaim("B2T > post-LN", "deep", "b2t", "post_ln"),
    PairClaim("B2T > pre-LN", "deep", "b2t", "pre_ln"),
    PairClaim("Hyper-Connections > pre-LN", "deep", "hyper", "pre_ln"),
    PairClaim("DenseFormer > pre-LN", "deep", "denseformer", "pre_ln"),
    PairClaim("mHC > pre-LN", "deep", "mhc", "pre_ln"),
)


def pair_differences(runs, claim: PairClaim, setting: str) -> list:
    """``claim``'s row minus its reference at the size's verdict budget in ``setting``, one
    difference per seed both rows have there."""
    rows, budget = runs.get((setting, claim.size), {}), VERDICT_BUDGETS[claim.size]
    return [recs[budget]["bleu"] - rows[claim.reference][seed][budget]["bleu"]
            for seed, recs in sorted(rows.get(claim.row, {}).items())
            if budget in recs and budget in rows.get(claim.reference, {}).get(seed, {})]


def pair_verdict(diffs: list) -> str:
    """One pair's word on a claim: ``level`` where the mean difference is within
    :data:`verdicts.LEVEL` of zero (no seed count resolves less), else the seeds' verdict
    (:func:`verdicts.claim_verdict`: yes, no, mixed); ``(1 seed)`` where one is all there is."""
    word = "level" if abs(statistics.mean(diffs)) < LEVEL else claim_verdict(diffs).split(" ")[0]
    return word + (" (1 seed)" if len(diffs) == 1 else "")


def across_pairs(main: list, other: list) -> str:
    """The verdict of one claim over two pairs from each pair's differences: holds on both,
    holds on one (level or mixed on the other), reverses (it fails on the other), fails on
    both, level (neither holds nor fails); "not yet" while a pair has no seed."""
    if not main or not other:
        return "not yet"
    words = [pair_verdict(d).split(" ")[0] for d in (main, other)]
    if words == ["yes", "yes"]:
        return "holds on both"
    if words == ["no", "no"]:
        return "fails on both"
    if "yes" in words and "no" in words:
        return "reverses"
    return "holds on one" if "yes" in words else "fails on one" if "no" in words else "level"


def second_seeds(runs, claims=PAIR_CLAIMS, other: str = "en-fr") -> list:
    """The (size, row, 2) runs on ``other`` that a claim's verdict needs: where seed 1's margin
    there is within :data:`verdicts.LEVEL` of zero, or of the other sign than the study's
    pair's mean margin, seed 2 of the row and of its reference."""
    setting, wanted = f"cpu, {pair_title(other)}", []
    for c in claims:
        main, first = pair_differences(runs, c, "cpu"), pair_differences(runs, c, setting)[:1]
        if first and main and (abs(first[0]) < LEVEL or (first[0] > 0) != (statistics.mean(main) > 0)):
            wanted += [r for r in ((c.size, c.row, 2), (c.size, c.reference, 2)) if r not in wanted]
    return wanted


def pairs_table(runs, claims=PAIR_CLAIMS, other: str = "en-fr") -> str:
    """Each claim of ``claims`` on the study's pair and on ``other`` (CPU, the study's
    schedule): the difference (mean ± std over seeds, n), each pair's verdict
    (:func:`pair_verdict`) and the verdict across the pairs (:func:`across_pairs`).
    Claims that neither pair has measured are left out."""
    settings = ("cpu", f"cpu, {pair_title(other)}")
    lines = [f"| claim | setting | {pair_title(MAIN_PAIR)}: difference (n) | holds? | {pair_title(other)}: "
             "difference (n) | holds? | across the pairs |", "|---|---|---:|---|---:|---|---|"]
    for c in claims:
        diffs = [pair_differences(runs, c, s) for s in settings]
        if not any(diffs):
            continue
        cells = [f"{_mean_std(d)} | {pair_verdict(d)}" if d else "— | —" for d in diffs]
        setting = f"{SIZE_SHORT[c.size]}, {VERDICT_BUDGETS[c.size]} updates"
        lines.append(f"| {c.claim} | {setting} | {cells[0]} | {cells[1]} | {across_pairs(*diffs)} |")
    return "\n".join(lines)


def pairs_glance(runs, claims=PAIR_CLAIMS, other: str = "en-fr") -> str:
    """The README's lines on the claims across pairs (:func:`pairs_table`): the claims that
    hold on both pairs, on one only (and what they do on the other), that reverse, and those
    ``other`` has not reached yet, each with its size; how many seeds are behind the
    differences on ``other`` is said (:func:`seed_counts`)."""
    settings, short = ("cpu", f"cpu, {pair_title(other)}"), (MAIN_PAIR.upper(), other.upper())
    groups, seeds = defaultdict(list), []
    for c in claims:
        diffs = [pair_differences(runs, c, s) for s in settings]
        if not diffs[0]:
            continue
        across, words = across_pairs(*diffs), [pair_verdict(d).split(" ")[0] if d else "" for d in diffs]
        if across == "holds on one":
            held = words.index("yes")
            across = f"holds on {short[held]}, {words[1 - held]} on {short[1 - held]}"
        groups[across].append(f"{c.claim} ({SIZE_SHORT[c.size].split(',')[0]})")
        seeds += [len(diffs[1])] if diffs[1] else []
    names = {"holds on both": f"Holds on {short[0]} and {short[1]}", "not yet": f"Not yet measured on {short[1]}"}
    order = sorted(groups, key=lambda word: (word == "not yet", word != "holds on both", word))
    lines = [f"- {names.get(word, word[0].upper() + word[1:])}: {', '.join(groups[word])}." for word in order]
    return f"Each claim on a second pair, {pair_title(other)}{seed_counts(seeds, 'not yet' in groups)}:\n\n" + \
        "\n".join(lines)


def seed_counts(seeds: list, unfinished: bool) -> str:
    """How many seeds are behind the claims' differences on the second pair, as the README
    says it: ``(1 seed each)``, ``(1 or 2 seeds per claim)``; "so far" while a claim is not
    yet measured there."""
    if not seeds:
        return ""
    lo, hi = min(seeds), max(seeds)
    counts = f"{lo} seed{'s' if lo != 1 else ''} each" if lo == hi else f"{lo} or {hi} seeds per claim"
    return f" ({counts}{' so far' if unfinished else ''})"


def tables(runs) -> dict:
    """The study's tables as the documents hold them, by marker name (:data:`MARKERS`)."""
    return {"curves-table": (bleu_table(runs) + "\n" + difference_table(runs)).strip() + "\n",
            "glance-table": glance_table(runs), "cross-layer-table": cross_layer_table(runs) + "\n",
            "gen2025-table": cross_layer_table(runs, rows=GEN2025_KINDS + GEN2025_VARIANTS) + "\n",
            "pairs-table": pairs_table(runs) + "\n", "pairs-glance": pairs_glance(runs) + "\n"}
