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
    """How far apart two identical configurations measured in the same rounds came out: the
    largest per-round ratio of the faster over the slower, less 1 (0.125: 12.5 %). A ratio
    of two different configurations cannot be told from 1 (or from another ratio) by less."""
    return max(max(r, 1.0 / r) for r in ratios) - 1.0


def identical_noise(records: Sequence[dict]) -> Optional[float]:
    """The noise floor of gpu_train.py's rows of one job at one token setting: the largest
    :func:`noise_floor` of any two rows with the same command line (arch, flags, dtype),
    from their tokens/s round by round (the same rounds, the same batches); None where no
    two rows are identical, or their rounds were not kept."""
    groups: Dict[tuple, List[dict]] = {}
    for r in records:
        if "arch" in r:  # (a line that does not say its command line is no one's twin)
            groups.setdefault((r["arch"], tuple(r["flags"]), r["dtype"]), []).append(r)
    floors = []
    for same in groups.values():
        for i, a in enumerate(same):
            for b in same[i + 1:]:
                rates_a, rates_b = a.get("tokens_per_s_rounds"), b.get("tokens_per_s_rounds")
                if rates_a and rates_b and len(rates_a) == len(rates_b):
                    floors.append(noise_floor([x / y for x, y in zip(rates_a, rates_b)]))
    return max(floors) if floors else None
