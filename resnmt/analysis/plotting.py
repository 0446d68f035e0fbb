"""One PNG per statistic: encoder and decoder side by side, one line per sublayer.

Reads the ``"statistics"`` part of ``analysis.json`` (see :mod:`resnmt.cli.analyze`):
``{statistic: {side: {sublayer: [value per layer, or None]}}}``.
"""
from pathlib import Path
from typing import Dict, List, Optional

import matplotlib

matplotlib.use("Agg")  # headless: never open a window
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from resnmt.analysis.hooks import SIDES, STATISTICS, SUBLAYER_LABELS  # noqa: E402

STYLE = {  # sublayer -> line style
    "self": dict(color="tab:blue", marker="o"),
    "cross": dict(color="tab:orange", marker="s"),
    "ffn": dict(color="tab:green", marker="^"),
    "output": dict(color="tab:purple", marker="D"),
}


def _save(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (PNG, its folder made) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _present(values: List[Optional[float]]) -> bool:
    return any(v is not None for v in values)


def plot_statistic(
    name: str, per_side: Dict[str, Dict[str, List[Optional[float]]]], title: str, path: Path, kinds: Dict[str, str]
) -> Path:
    """Write ``path`` (PNG): two subplots (encoder, decoder), x = layer index, one line
    per sublayer with a legend. A side without the statistic says so in its panel."""
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.6), sharey=True, constrained_layout=True)
    all_values = [
        v for side in per_side.values() for values in side.values() for v in values if v is not None
    ]
    log_scale = name == "grad_norm" and all_values and min(all_values) > 0 and max(all_values) / min(all_values) > 20
    for ax, side in zip(axes, SIDES):
        series = per_side.get(side, {})
        ax.set_title(f"{side} ({kinds.get(side, '?')})")
        ax.set_xlabel("layer index (0 = nearest the embeddings)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        drawn = False
        for sublayer, values in series.items():
            if not _present(values):
                continue
            xs = [i for i, v in enumerate(values) if v is not None]
            ys = [values[i] for i in xs]
            ax.plot(xs, ys, label=SUBLAYER_LABELS.get(sublayer, sublayer), linewidth=1.6, markersize=5,
                    **STYLE.get(sublayer, {}))
            drawn = True
        if drawn:
            ax.legend(fontsize=8, loc="best")
        else:
            ax.text(0.5, 0.5, f"no {STATISTICS[name].description.split(':')[0]}\nin this side", ha="center", va="center",
                    transform=ax.transAxes, color="gray")
        if log_scale:
            ax.set_yscale("log")
    axes[0].set_ylabel(STATISTICS[name].axis_label)
    if STATISTICS[name].unit_interval:
        axes[0].set_ylim(-0.02, 1.02)
    fig.suptitle(f"{title}: {STATISTICS[name].description}", fontsize=11)
    return _save(fig, path)


def plot_all(statistics: dict, title: str, out_dir: Path, kinds: Dict[str, str]) -> List[Path]:
    """One PNG per statistic present in ``statistics``, named ``<statistic>.png``."""
    return [
        plot_statistic(name, statistics[name], title, Path(out_dir) / f"{name}.png", kinds)
        for name in STATISTICS
        if name in statistics
    ]


STREAM_LABELS = {  # learned stream weights -> (title, colour bar label)
    "dlcl_weights": ("DLCL combination weights W[l, k]", "weight"),
    "denseformer_weights": ("DenseFormer weights α[i, j] (row i-1: block i's input)", "weight"),
    "hc_read": ("Hyper-Connections A_m (row: sublayer k, column: stream)", "weight"),
    "hc_write": ("Hyper-Connections B (row: sublayer k, column: stream)", "weight"),
    "hc_mix": ("Hyper-Connections A_r per sublayer k", "weight"),
    "mhc_pre": ("mHC H_pre at φ = 0 (row: sublayer k, column: stream)", "weight"),
    "mhc_post": ("mHC H_post at φ = 0 (row: sublayer k, column: stream)", "weight"),
    "mhc_res": ("mHC H_res at φ = 0 per sublayer k", "weight"),
}
# The axes of the streams' matrices whose rows are sublayers (in the stack's order: each
# layer's self-attention, [cross-attention,] FFN), not layer inputs; the others are DLCL's.
# Those whose row is a row-major n×n matrix are drawn as one n×n heat map per sublayer.
ROW_MAJOR = frozenset({"hc_mix", "mhc_res"})
SUBLAYER_ROWS = {name: "stream" for name in ("hc_read", "hc_write", "mhc_pre", "mhc_post")}


def plot_mixing_blocks(name: str, per_side: Dict[str, List[List[float]]], title: str, path: Path,
                       per_row: int = 6) -> Path:
    """Write ``path`` (PNG): a row-major mixing matrix per sublayer (``ROW_MAJOR``: row k
    holds sublayer k's n×n matrix flattened) drawn as one small n×n heat map per
    sublayer, ``per_row`` to a line, each side on lines of its own, on one colour scale."""
    import numpy as np

    sides = [side for side in SIDES if side in per_side]
    blocks = {side: np.array(per_side[side], dtype=float) for side in sides}
    n = round(blocks[sides[0]].shape[1] ** 0.5)
    columns = min(per_row, max(len(b) for b in blocks.values()))
    lines = {side: -(-len(blocks[side]) // columns) for side in sides}
    low, high = min(b.min() for b in blocks.values()), max(b.max() for b in blocks.values())
    height = sum(lines.values())
    fig, axes = plt.subplots(height, columns, figsize=(1.7 * columns + 1.2, 1.9 * height + 0.6),
                             constrained_layout=True, squeeze=False)
    heading, bar = STREAM_LABELS.get(name, (name, "value"))
    image, first = None, 0
    for side in sides:
        for k, ax in enumerate(axes[first:first + lines[side]].flat):
            if k >= len(blocks[side]):
                ax.axis("off")
                continue
            matrix = blocks[side][k].reshape(n, n)
            image = ax.imshow(matrix, cmap="viridis", vmin=low, vmax=high, origin="upper")
            for i in range(n):
                for j in range(n):
                    ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6, color="w")
            ax.set_title(f"{side} {k}", fontsize=8)
            ax.set_xticks(range(n))
            ax.set_yticks(range(n))
            ax.tick_params(labelsize=6)
            if k % columns == 0:
                ax.set_ylabel("i", fontsize=8)
            ax.set_xlabel("j", fontsize=8)
        first += lines[side]
    fig.colorbar(image, ax=axes, label=bar, shrink=0.8)
    fig.suptitle(f"{title}: {heading}", fontsize=10)
    return _save(fig, path)


def plot_stream_weights(name: str, per_side: Dict[str, List[List[float]]], title: str, path: Path) -> Path:
    """Write ``path`` (PNG): one heat map per side of a stream's learned matrix, row l =
    the input of layer l (the last row: the stack's output), column k = the output of
    layer k (0: the embedding); cells the stream never reads are blank. The row-major
    mixing matrices (``ROW_MAJOR``) go to :func:`plot_mixing_blocks`."""
    import numpy as np

    if name in ROW_MAJOR:
        return plot_mixing_blocks(name, per_side, title, path)
    sides = [side for side in SIDES if side in per_side]
    fig, axes = plt.subplots(1, len(sides), figsize=(4.6 * len(sides), 4.0), constrained_layout=True, squeeze=False)
    heading, bar = STREAM_LABELS.get(name, (name, "value"))
    for ax, side in zip(axes[0], sides):
        matrix = np.array(per_side[side], dtype=float)
        shown = np.ma.masked_where(matrix == 0, matrix)
        image = ax.imshow(shown, cmap="viridis", origin="upper")
        n = matrix.shape[0]
        for row in range(n):
            for col in range(matrix.shape[1]):
                if matrix[row, col] != 0 and n <= 13 and matrix.shape[1] <= 16:
                    ax.text(col, row, f"{matrix[row, col]:.2f}", ha="center", va="center", fontsize=7, color="w")
        ax.set_title(side)
        if name in SUBLAYER_ROWS:
            ax.set_xlabel(SUBLAYER_ROWS[name])
            ax.set_ylabel("sublayer k (in the stack's order)")
        else:
            ax.set_xlabel("output of layer k (0 = embedding)")
            ax.set_ylabel(f"input of layer l ({n - 1} = stack output)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.colorbar(image, ax=ax, label=bar, shrink=0.8)
    fig.suptitle(f"{title}: {heading}", fontsize=11)
    return _save(fig, path)


NORM_LABELS = {  # learned norm scalars -> title
    "dyt_alpha": "DyT's learned alpha (tanh(alpha x)), per layer",
}


def plot_learned_norms(name: str, per_side: Dict[str, dict], title: str, path: Path) -> Path:
    """Write ``path`` (PNG): one panel per side, one line per place a norm sits in a layer
    (its value at each layer), and the stack's own norms (the final norm) as squares after
    the last layer (``per_side``: ``resnmt.cli.analyze.learned_norms``' entries)."""
    sides = [side for side in SIDES if side in per_side]
    fig, axes = plt.subplots(1, len(sides), figsize=(4.6 * len(sides), 3.6), constrained_layout=True,
                             squeeze=False, sharey=True)
    for ax, side in zip(axes[0], sides):
        layers, stack = per_side[side]["layers"], per_side[side]["stack"]
        num_layers = max((len(v) for v in layers.values()), default=0)
        for where, values in layers.items():
            ax.plot(range(len(values)), [float("nan") if v is None else v for v in values], "o-", label=where)
        for where, value in stack.items():
            ax.plot([num_layers], [value], "s", label=f"{where} (stack)")
        ax.set_title(side)
        ax.set_xlabel(f"layer ({num_layers} = the stack's own norms)" if stack else "layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("alpha")
    fig.suptitle(f"{title}: {NORM_LABELS.get(name, name)}", fontsize=11)
    return _save(fig, path)
