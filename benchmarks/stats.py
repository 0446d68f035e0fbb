"""The statistics of repeated measurements, written once: the median with the least and
the largest value, a ratio per round of two configurations measured in the same rounds,
the middle half of the rounds, and the noise floor that identical configurations show.
"""
import math
import statistics
from typing import Dict, List, Optional, Sequence, Tuple


def median_min_max(values: Sequence[float]) -> Tuple[float, float, float]:
    """(median, least, largest) of ``values`` (at least one)."""
    return statistics.median(values), min(values), max(values)


def summary(values) -> Dict[str, object]:
    """``median``, ``min`` and ``max`` of the finite ``values`` (None without any), and the
    ``values`` themselves: how speed.py records each ratio over its rounds."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"median": None, "min": None, "max": None, "values": []}
    med, lo, hi = median_min_max(values)
    return {"median": med, "min": lo, "max": hi, "values": values}


def round_ratios(samples: Sequence[Tuple[float, float]], reference: Sequence[Tuple[float, float]]) -> List[float]:
    """Per round, the rate of ``samples`` over the rate of ``reference`` (both (seconds,
    tokens) per round, the same rounds in order)."""
    return [(tok / sec) / (ref_tok / ref_sec) for (sec, tok), (ref_sec, ref_tok) in zip(samples, reference)]


def middle_half(values: Sequence[float]) -> Optional[Tuple[float, float]]:
    """The first and third quartile of ``values`` (what one drifting round cannot move),
    from four values on; None for fewer."""
    if len(values) < 4:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q1, q3


def noise_floor(ratios: Sequence[float]) -> float:
    """How far apart two identical configurations measured in the same rounds came out:
    the largest of their per-round ratios' distances from 1. A ratio of two different
    configurations cannot be told from 1 (or from another ratio) by less than this."""
    return max(abs(r - 1.0) for r in ratios)
