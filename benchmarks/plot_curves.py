#!/usr/bin/env python
"""The curves study's figures from benchmarks/results/curves.jsonl (written by
benchmarks/curves.py); its tables and verdicts are campaign/tables.py's (make_tables.py writes them).

    python benchmarks/plot_curves.py                   # docs/figures/curves-*.png

Figures (one panel per depth): sacreBLEU against updates per row (the mean over seeds,
broken where the set of seeds changes, and each seed's own line) and its difference from
post-LN's in the same setting, paired by seed, validation loss against updates (the run's newest line holds every validation
so far), and the diagnostics over training from resnmt-analyze at each milestone
(rSkip effective skip:residual ratio per layer, block-output gradient norm per layer for
post_ln and rskip_ln; for every row, how much of the gradient reaches the encoder), and
what the models that learn a mixing learned by their newest milestone (DLCL's combination
weights, HC/mHC's mixings, DenseFormer's weights, DyT's alpha: ``curves-learned-*.png``,
drawn by resnmt-analyze's own plotting from the milestone's analysis).
Each row keeps one color throughout; a control (a row with one shared setting changed,
``campaign.rows.CONTROLS``) is dashed with open markers, in the color of the row it changes.
"""
import argparse
import logging
import statistics
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from campaign.files import REPO_ROOT, RESULTS  # noqa: E402
from resnmt.options import Option, add_to_command  # noqa: E402
from resnmt.study.rows import slug  # noqa: E402
from campaign.rows import CONTROLS, DEFAULT_MILESTONES, GEN2025_KINDS, GEN2025_VARIANTS, NEW_KINDS  # noqa: E402
from campaign.tables import (SIZE_TITLES, load, of_main_pair, ordered_keys, paired_differences,  # noqa: E402
                                 reference_row, titled)

# The budget chosen where post-LN's curve flattens (2+2 only: the other sizes stop where a
# session's compute does, not at a chosen budget).
FINAL_BUDGETS = {"small": DEFAULT_MILESTONES["small"][-1]}
# Ticks of a logarithmic updates axis: milestones of the study that double.
UPDATE_TICKS = (200, 600, 1200, 2400, 4800, 9600, 19200, 38400)


def with_curves(runs):
    """The (device, size) entries with at least two budgets: a single budget is no curve,
    so it stays out of the figures (the tables show it)."""
    return {key: rows for key, rows in runs.items()
            if len({u for seeds in rows.values() for recs in seeds.values() for u in recs}) >= 2}


def row_styles(runs) -> dict:
    """``{row: plot keywords}``: one color per row, the same in every panel and figure; a
    control (``campaign.rows.CONTROLS``) is dashed, in the color of the row it changes."""
    rows = sorted({row for rows in runs.values() for row in rows})
    plain = [row for row in rows if row not in CONTROLS or CONTROLS[row].row not in rows]
    styles = {row: {"color": f"C{i}", "linestyle": "-"} for i, row in enumerate(plain)}
    for row in rows:
        if row not in styles:
            styles[row] = {"color": styles[CONTROLS[row].row]["color"], "linestyle": "--", "markerfacecolor": "white"}
    return styles


def panels(runs):
    keys = ordered_keys(runs)
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4.2), squeeze=False, constrained_layout=True)
    return fig, list(zip(keys, axes[0]))


def updates_axis(ax, size: str) -> None:
    """The x axis of updates: logarithmic where the panel's budgets span a factor of 10 or
    more (200 to 19200 updates at 2+2: on a linear axis the first 2400 updates, where the
    rows differ most, would be squeezed into an eighth of the panel), ticked at budgets
    that double (:data:`UPDATE_TICKS`); the 2+2 final budget is marked."""
    lo, hi = ax.dataLim.intervalx
    if lo > 0 and hi / lo >= 10:
        ticks = [u for u in UPDATE_TICKS if lo <= u <= hi]
        ax.set_xscale("log")
        if ticks:
            ax.set_xticks(ticks, [str(u) for u in ticks])
            ax.xaxis.set_minor_formatter(NullFormatter())
    if size in FINAL_BUDGETS and FINAL_BUDGETS[size] <= hi:  # marked where the panel reaches it
        ax.axvline(FINAL_BUDGETS[size], color="gray", linestyle="--", linewidth=0.8)
        ax.text(FINAL_BUDGETS[size], 0.5, "final budget ", transform=ax.get_xaxis_transform(), fontsize=7,
                color="gray", rotation=90, ha="right", va="center")


def label_panel(ax, device: str, size: str, ylabel: str) -> None:
    ax.set_title(f"{SIZE_TITLES.get(size, size)} ({titled(device)})")
    updates_axis(ax, size)
    ax.set_xlabel("updates (4096 tokens each)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def save(fig, title: str, out: Path) -> None:
    fig.suptitle(textwrap.fill(title, width=int(fig.get_figwidth() * 10)))  # one panel's figure too
    fig.savefig(out, dpi=100)
    plt.close(fig)


def mean_segments(values: dict) -> list[tuple[list, list]]:
    """``values``: {seed: {updates: value}}. The mean over seeds as [(budgets, means)], one
    segment per run of consecutive budgets that the same seeds have reached: a line drawn
    across a change of seeds would jump with their composition, not with training, so it
    breaks there. A budget that only one seed of several has reached is left to that seed's
    own thin line."""
    fewest = min(2, len(values))
    segments, seeds_of_segment = [], None
    for u in sorted(set().union(*values.values())):
        present = frozenset(seed for seed, per_update in values.items() if u in per_update)
        if len(present) < fewest:
            seeds_of_segment = None
            continue
        if present != seeds_of_segment:
            segments.append(([], []))
            seeds_of_segment = present
        segments[-1][0].append(u)
        segments[-1][1].append(statistics.mean(values[seed][u] for seed in present))
    return segments


def bleu_of(seeds: dict) -> dict:
    """{seed: {updates: sacreBLEU}} of one row's records."""
    return {seed: {u: r["bleu"] for u, r in recs.items()} for seed, recs in seeds.items()}


def _mean_and_seed_lines(ax, values: dict, style: dict, label: str) -> None:
    """The mean over seeds (thick, labelled; :func:`mean_segments`) and, with several seeds,
    each seed's own line (thin)."""
    legend = label if len(values) == 1 else f"{label} ({len(values)} seeds)"
    for i, (xs, means) in enumerate(mean_segments(values)):
        ax.plot(xs, means, marker="o", **style, label=legend if i == 0 else None)
    if len(values) > 1:
        for per_update in values.values():
            us = sorted(per_update)
            ax.plot(us, [per_update[u] for u in us], marker=".", markersize=4, linewidth=0.8, alpha=0.45,
                    color=style["color"], linestyle=style["linestyle"])


def plot_bleu(runs, out: Path) -> None:
    fig, cells = panels(runs)
    styles = row_styles(runs)
    for (device, size), ax in cells:
        for row, seeds in sorted(runs[(device, size)].items()):
            _mean_and_seed_lines(ax, bleu_of(seeds), styles[row], row)
        label_panel(ax, device, size, "sacreBLEU, test2016 (avg of 5 ckpts, beam 4)")
    save(fig, "BLEU against training budget, each panel's pair in its title (thick: mean over seeds; thin: each seed)", out)


def plot_bleu_difference(runs, out: Path, baseline: str = "post_ln") -> None:
    """Each row's sacreBLEU minus its reference row's (:func:`reference_row`), paired by seed:
    the gaps the verdicts are about, which the BLEU figure's scale hides at 2+2 layers."""
    fig, cells = panels(runs)
    styles = row_styles(runs)
    for (device, size), ax in cells:
        rows = runs[(device, size)]
        for row in sorted(rows):
            diffs = paired_differences(rows, row, baseline)
            if row != baseline and diffs:
                _mean_and_seed_lines(ax, diffs, styles[row], f"{row} − {reference_row(row, baseline)}")
        ax.axhline(0.0, color="gray", linewidth=0.8)
        label_panel(ax, device, size, "sacreBLEU difference, paired by seed")
    save(fig, f"BLEU minus {baseline}'s in the same setting (thick: mean over seeds; thin: each seed)", out)


def plot_valid(runs, out: Path) -> None:
    fig, cells = panels(runs)
    styles = row_styles(runs)
    for (device, size), ax in cells:
        for row, seeds in sorted(runs[(device, size)].items()):
            for k, (seed, recs) in enumerate(sorted(seeds.items())):
                newest = recs[max(recs)]
                pts = [p for p in newest["valid"] if p[0] >= 400]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], **styles[row], linewidth=1,
                        label=row if k == 0 else None)
        label_panel(ax, device, size, "validation loss (label-smoothed, base 2)")
    save(fig, "Validation loss during training (one line per seed)", out)


RSKIP = "rskip_ln (λ=2)"
SUBLAYER_STYLES = {"self": "-", "cross": ":", "ffn": "--"}


def _ratio_panel(ax, rskip: dict, side: str, title: str) -> None:
    """rSkip's effective skip:residual ratio per layer and sublayer against updates."""
    xs = sorted(rskip)
    if xs:
        stats = rskip[xs[-1]]["analysis"]["statistics"]["rskip_ratio"][side]
        n = max(len(v) for v in stats.values())
        for sublayer, values in stats.items():
            for layer in range(len(values)):
                ax.plot(xs, [rskip[u]["analysis"]["statistics"]["rskip_ratio"][side][sublayer][layer] for u in xs],
                        linestyle=SUBLAYER_STYLES.get(sublayer, "-"), marker=".",
                        color=plt.cm.viridis(layer / max(n - 1, 1)), label=f"layer {layer} {sublayer}")
    ax.axhline(1.0, color="gray", linestyle=":", label="post-LN (1)")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("updates")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, ncol=2 if xs and n > 2 else 1)


def _gradient_profile_panel(ax, recs: dict, title: str) -> None:
    """Gradient norm of each block output against the block's depth (encoder 1..N, then
    decoder 1..M): the papers' Figure-3 profile, one line per milestone (darker = later)."""
    xs = sorted(recs)
    for i, u in enumerate(xs):
        grads = recs[u]["analysis"]["statistics"]["grad_norm"]
        blocks = grads["encoder"]["output"] + grads["decoder"]["output"]
        ax.plot(range(1, len(blocks) + 1), blocks, marker=".",
                color=plt.cm.magma_r(0.15 + 0.8 * i / max(len(xs) - 1, 1)), label=f"{u} updates")
    if xs:
        grads = recs[xs[0]]["analysis"]["statistics"]["grad_norm"]
        n_enc, n_dec = len(grads["encoder"]["output"]), len(grads["decoder"]["output"])
        ax.axvline(n_enc + 0.5, color="gray", linestyle=":", linewidth=0.8)
        ax.text(0.02, 0.97, "encoder | decoder", transform=ax.transAxes, fontsize=7, va="top")
        ax.set_xticks(range(1, n_enc + n_dec + 1))
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("block (encoder 1..N, decoder 1..M)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if xs:
        ax.legend(fontsize=6)
    else:
        ax.text(0.5, 0.5, "not run yet", transform=ax.transAxes, ha="center", color="gray")


def plot_diagnostics(runs, out: Path) -> None:
    """For each depth with seed 1 of post_ln or rskip_ln: rSkip's ratio per layer against
    updates (encoder, decoder), and the gradient-norm profile over blocks at each milestone
    for post_ln and rskip_ln (shared y-axis, so the two are comparable)."""
    keys = [k for k in ordered_keys(runs) if any(runs[k].get(r, {}).get(1) for r in ("post_ln", RSKIP))]
    fig, axes = plt.subplots(max(len(keys), 1), 4, figsize=(22, 4.4 * max(len(keys), 1)), squeeze=False,
                             constrained_layout=True)
    for (device, size), row_axes in zip(keys, axes):
        rows, where = runs[(device, size)], f"{SIZE_TITLES.get(size, size)} ({titled(device)})"
        rskip = rows.get(RSKIP, {}).get(1, {})
        for side, ax in zip(("encoder", "decoder"), row_axes[:2]):
            _ratio_panel(ax, rskip, side, f"{where}: rSkip+LN λ=2 {side}, skip : residual")
        row_axes[3].sharey(row_axes[2])
        for row, ax in (("post_ln", row_axes[2]), (RSKIP, row_axes[3])):
            _gradient_profile_panel(ax, rows.get(row, {}).get(1, {}), f"{where}: {row}, block-output gradient norm")
    save(fig, "Diagnostics during training (seed 1; resnmt-analyze on 500 validation sentences at each milestone)",
         out)


def encoder_gradient_share(record: dict) -> float:
    """Mean block-output gradient norm of the encoder blocks over that of the top decoder
    block: 1 when the gradient reaches the encoder undiminished, small when it decays on
    its way down the stack (what the papers' Figure 3 shows layer by layer)."""
    grads = record["analysis"]["statistics"]["grad_norm"]
    return statistics.mean(grads["encoder"]["output"]) / grads["decoder"]["output"][-1]


def plot_gradient_share(runs, out: Path) -> None:
    """One panel per depth: ``encoder_gradient_share`` against updates, one line per row (seed 1)."""
    fig, cells = panels(runs)
    styles = row_styles(runs)
    for (device, size), ax in cells:
        for row, seeds in sorted(runs[(device, size)].items()):
            recs = seeds.get(1, {})
            xs = sorted(recs)
            if xs:
                ax.plot(xs, [encoder_gradient_share(recs[u]) for u in xs], marker="o", **styles[row], label=row)
        ax.axhline(1.0, color="gray", linestyle=":", linewidth=0.8)
        ax.set_yscale("log")
        label_panel(ax, device, size, "mean encoder block gradient / top decoder block's")
    save(fig, "How much gradient reaches the encoder during training (seed 1; resnmt-analyze, 500 valid sentences)",
         out)


# Families drawn each in a figure of their own beside post-LN and pre-LN (the study's
# figures keep the papers' kinds), and judged by :func:`campaign.tables.cross_layer_table`:
# the methods that cross layers, Peri-LN and the normalizations; the 2025 generation.
FAMILIES = {
    "cross-layer": frozenset(NEW_KINDS) | {name for name, c in CONTROLS.items() if c.row in NEW_KINDS},
    "gen2025": frozenset(GEN2025_KINDS + GEN2025_VARIANTS),
}
FAMILY_REFERENCES = ("post_ln", "pre_ln", "post_ln (warm-up 1000)")


def split_rows(runs, families=FAMILIES):
    """(the study's rows, {family: its rows with their references}), each as ``runs``; a
    family appears once one of its rows has a milestone."""
    own = frozenset().union(*families.values())
    study = {key: {row: seeds for row, seeds in rows.items() if row not in own} for key, rows in runs.items()}
    grouped = {}
    for family, members in families.items():
        for key, rows in runs.items():
            reached = [u for row, seeds in rows.items() if row in members for recs in seeds.values() for u in recs]
            if not reached:
                continue
            last = max(max(reached), DEFAULT_MILESTONES["deep"][-1])  # the references drawn as far as the new rows
            grouped.setdefault(family, {})[key] = {
                row: {seed: {u: r for u, r in recs.items() if u <= last} for seed, recs in seeds.items()}
                for row, seeds in rows.items() if row in members or row in FAMILY_REFERENCES}
    return study, grouped


FAMILY_TITLES = {"cross-layer": "Methods that cross layers, Peri-LN, RMSNorm and DyT",
                 "gen2025": "The 2025 generation"}


def plot_cross_layer(runs, out: Path, family: str = "cross-layer") -> None:
    """sacreBLEU against updates of one family's rows beside post-LN and pre-LN."""
    fig, cells = panels(runs)
    styles = row_styles(runs)
    for (device, size), ax in cells:
        for row, seeds in sorted(runs[(device, size)].items()):
            own = {1: bleu_of(seeds)[1]} if 1 in seeds else bleu_of(seeds)  # seed 1: what the new rows have
            _mean_and_seed_lines(ax, own, styles[row], row)
        label_panel(ax, device, size, "sacreBLEU, test2016 (avg of 5 ckpts, beam 4)")
    save(fig, f"{FAMILY_TITLES[family]} beside post-LN and pre-LN (seed 1)", out)


def newest_learned(runs):
    """{(device, size, row): (record, what)}: per row, the newest seed-1 milestone whose
    analysis holds learned stream weights or norm scalars (``what``: "streams"/"norms")."""
    found = {}
    for (device, size), rows in runs.items():
        for row, seeds in rows.items():
            for updates in sorted(seeds.get(1, {}), reverse=True):
                analysis = seeds[1][updates].get("analysis", {})
                kinds = [w for w in ("streams", "norms") if analysis.get(w)]
                if kinds:
                    found[(device, size, row)] = (seeds[1][updates], kinds)
                    break
    return found


def plot_learned(runs, figures: Path) -> list:
    """One PNG per row, size and learned quantity (``curves-learned-<row>-<size>-<name>.png``)
    of the study's language pair (docs/study.md shows those; another pair's runs are drawn in
    the BLEU and loss panels only)."""
    from resnmt.analysis.plotting import plot_learned_norms, plot_stream_weights

    written = []
    for (device, size, row), (record, kinds) in sorted(newest_learned(runs).items()):
        if not of_main_pair(device):
            continue
        title = (f"{row}, {SIZE_TITLES.get(size, size)} ({titled(device)}), seed 1, "
                 f"{record['updates']} updates")
        stem = f"curves-learned-{slug(row)}-{size}{f'-{slug(device)}' if device != 'cpu' else ''}"
        for name, sides in record["analysis"].get("streams", {}).items():
            written.append(plot_stream_weights(name, sides, title, figures / f"{stem}-{name}.png"))
        for name, sides in record["analysis"].get("norms", {}).items():
            written.append(plot_learned_norms(name, sides, title, figures / f"{stem}-{name}.png"))
    return written


OPTIONS = (
    Option("results", str(RESULTS / "curves.jsonl"), "the curves study's JSON lines", metavar="JSONL"),
    Option("figures", str(REPO_ROOT / "docs" / "figures"), "output directory of the PNGs", metavar="DIR"),
)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to_command(p, OPTIONS)
    a = p.parse_args(argv)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG
    runs = load(Path(a.results))
    if not runs:
        p.error(f"no curves results in {a.results}; run benchmarks/curves.py first")
    figures = Path(a.figures)
    figures.mkdir(parents=True, exist_ok=True)
    study_runs, families = split_rows(with_curves(runs))
    curves = {key: rows for key, rows in study_runs.items() if rows}
    for family, family_runs in families.items():
        plot_cross_layer(family_runs, figures / f"curves-{family}.png", family)
    plot_bleu(curves, figures / "curves-bleu.png")
    plot_bleu_difference(curves, figures / "curves-bleu-difference.png")
    plot_valid(curves, figures / "curves-valid-loss.png")
    plot_diagnostics(curves, figures / "curves-diagnostics.png")
    plot_gradient_share(curves, figures / "curves-gradient-share.png")
    plot_learned(runs, figures)
    print(f"figures in {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
