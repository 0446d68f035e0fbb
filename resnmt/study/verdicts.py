"""The study's verdict rule on a claim, from the seeds of the curves study: ``claim_verdict``
(yes, no or mixed), ``level_verdict`` (level, above, below or mixed), ``LEVEL``, the gap one
row's own seeds show, and ``VERDICT_SEEDS``, the seeds a verdict rests on.
"""


# A claim of matching (≥) holds for a seed within this many BLEU below its reference: the
# spread of one row's own seeds at 2+2 (0.3-0.6), as the cross-layer table counts level.
LEVEL = 0.5
# The study's rule: a claim is a verdict when it rests on at least this many seeds paired by
# seed; on fewer it is a first look.
VERDICT_SEEDS = 2


def claim_verdict(diffs: list, at_least: bool = False) -> str:
    """``yes`` when every seed is ahead (a claim of matching: no seed more than
    :data:`LEVEL` behind), ``no`` when every seed is behind (by more than :data:`LEVEL`),
    else ``mixed``; ``(1 seed)`` where one seed is all there is."""
    holds = [d >= -LEVEL if at_least else d > 0 for d in diffs]
    fails = [d < -LEVEL if at_least else d < 0 for d in diffs]
    word = "yes" if all(holds) else "no" if all(fails) else "mixed"
    return word + (" (1 seed)" if len(diffs) == 1 else "")


def level_verdict(diffs: list) -> str:
    """``level`` when every difference is within :data:`LEVEL` on both sides, else ``above``
    (none more than LEVEL below) or ``below`` (none more than LEVEL above), else ``mixed``."""
    if all(abs(d) <= LEVEL for d in diffs):
        return "level"
    if all(d >= -LEVEL for d in diffs):
        return "above"
    return "below" if all(d <= LEVEL for d in diffs) else "mixed"
