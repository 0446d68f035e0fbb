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
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_all(statistics: dict, title: str, out_dir: Path, kinds: Dict[str, str]) -> List[Path]:
    """One PNG per statistic present in ``statistics``, named ``<statistic>.png``."""
    return [
        plot_statistic(name, statistics[name], title, Path(out_dir) / f"{name}.png", kinds)
        for name in STATISTICS
        if name in statistics
    ]
