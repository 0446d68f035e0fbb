"""The benchmarks' verdicts, each named for what it judges: a measured ratio against its
target (``target_verdict``: pass or MISS), gpu_train.py's rows against their targets
(``trainer_verdict``) and whether a same-math pair resolves 2 % (``pair_resolution``),
whether a kind trains in half precision (``fp16_verdicts``, from what ``fp16_log_record``
reads of fairseq's log); a paper's claim against the study's seeds is
resnmt.study.verdicts'.
"""
from rows import Comparison


# SAS rows: measured training ratio over the one the gates' multiply-adds predict (the
# SAS overhead table); 0.95 where no other target was set.
PREDICTION_TARGETS = {"sas (gate h) fused": 1.0}
PREDICTION_TARGET_DEFAULT = 0.95


def target_verdict(value, target, higher_is_better=True):
    """``pass`` or ``MISS`` of a measured ratio against its target ("" without either)."""
    if target is None or value is None:
        return ""
    ok = value >= target if higher_is_better else value <= target
    return "pass" if ok else "MISS"


# A same-math pair resolves 2 %: its ratio over at least RESOLVE_ROUNDS rounds,
# the ratios' range and the row's own spread under RESOLUTION, and two identical
# configurations of the same job within RESOLUTION of each other (the noise floor): a
# ratio from one round has a spread of 0 by construction, and resolves nothing.
RESOLUTION = 0.02
RESOLVE_ROUNDS = 4


def pair_resolution(rec: dict, noise) -> list:
    """Why a same-math pair's ratio (``rec``: a gpu_train.py row with ``ratio_min``,
    ``ratio_max``, ``spread``, ``rounds`` and, from four rounds on, ``ratio_q1``/``ratio_q3``)
    does not resolve :data:`RESOLUTION`, given the job's noise floor ``noise`` (None: not
    measured): a list of reasons, empty when it resolves."""
    reasons = []
    width = rec["ratio_max"] - rec["ratio_min"]
    if width >= RESOLUTION:
        reasons.append(f"rows within {100 * width:.1f} % of each other cannot be separated"
                       + (f"; the middle half of the {rec['rounds']} rounds lies within {rec['ratio_q1']:.3f}-"
                          f"{rec['ratio_q3']:.3f}" if "ratio_q1" in rec else ""))
    elif rec["spread"] >= RESOLUTION:
        reasons.append(f"its tokens/s spread {100 * rec['spread']:.1f} % over the rounds")
    if rec["rounds"] < RESOLVE_ROUNDS:
        reasons.append(f"{rec['rounds']} round{'s' if rec['rounds'] > 1 else ''} ({RESOLVE_ROUNDS} needed)")
    if noise is None:
        reasons.append("no noise floor: no two identical configurations in the job")
    elif noise >= RESOLUTION:
        reasons.append(f"identical configurations in the job differed by up to {100 * noise:.1f} %")
    return reasons


# A speed target ("at least 3x stock") passes only where noise cannot make it: over at least
# CLEAR_ROUNDS rounds, the lowest round's ratio, shrunk by the job's noise floor (identical
# runs' largest per-round ratio), still clears it.
CLEAR_ROUNDS = 3


def ratio_lower_bound(ratios: list, noise) -> float:
    """The lowest per-round ratio over ``1 + noise`` (the noise floor): what the ratio is at
    least, whichever way the noise went."""
    return min(ratios) / (1.0 + (noise or 0.0))


def clears_target(times: float, ratios: list, noise) -> list:
    """Why per-round ratios ``ratios`` with the job's noise floor ``noise`` (None: not
    measured) do not show "at least ``times``": a list of reasons, empty when they do."""
    reasons = []
    if len(ratios) < CLEAR_ROUNDS:
        reasons.append(f"{len(ratios)} round{'s' if len(ratios) != 1 else ''} ({CLEAR_ROUNDS} needed)")
    if noise is None:
        reasons.append("no noise floor: no run repeated in its job")
    if ratios and ratio_lower_bound(ratios, noise) < times:
        reasons.append(f"the lowest round's ratio {min(ratios):.3f} over the noise floor "
                       f"(±{100 * (noise or 0.0):.1f} %) is {ratio_lower_bound(ratios, noise):.3f}, under {times:g}")
    return reasons


def trainer_verdict(c: Comparison, rec: dict, noise=None) -> dict:
    """gpu_train.py's verdict on a row's training ratio to its reference (``rec``: its
    ``ratio`` with min, max and spread over rounds, ``ratio_rounds``, and ``flops_ratio``):
    the ``target`` as text and whether it ``meets`` it (a speed target: :func:`clears_target`,
    with its lower bound and why not); for a same-math pair also whether the measurement
    ``resolves`` 2 % (:func:`pair_resolution`, with the job's noise floor ``noise``)."""
    if c.times:
        ratios = rec.get("ratio_rounds") or [rec["ratio"]]
        why = clears_target(c.times, ratios, noise)
        return {"target": f">= {c.times:g}x {c.reference.replace('_', ' ')}", "meets": not why,
                "ratio_lower_bound": ratio_lower_bound(ratios, noise), "why_not": "; ".join(why)}
    if c.band:
        lo, hi = c.band
        return {"target": f"{lo}-{hi}", "meets": lo <= rec["ratio"] <= hi,
                "resolves": not pair_resolution(rec, noise)}
    if c.flops and "flops_ratio" in rec:
        goal = c.flops * rec["flops_ratio"]
        return {"target": f">= {c.flops} x FLOPs ratio = {goal:.3f}", "meets": rec["ratio"] >= goal}
    if c.train:
        return {"target": f">= {c.train}", "meets": rec["ratio"] >= c.train}
    return {}


def fp16_log_record(log) -> dict:
    """What fp16.py records of a ``fairseq-train --fp16`` run's log (a ``FairseqLog``): the
    updates skipped for overflowing gradients, the last loss scale and training loss
    logged, and whether the loss scale reached its minimum (which stops the run)."""
    last = next((f for f in reversed(log.inner) if {"loss", "loss_scale", "num_updates"} <= set(f)), None)
    scales = log.overflow_scales
    return {
        "overflows": len(scales),
        "loss_scale": float(last["loss_scale"]) if last else (scales[-1] if scales else None),
        "train_loss": float(last["loss"]) if last else None,
        "updates_logged": int(last["num_updates"]) if last else 0,
        "min_scale_reached": log.min_scale_reached,
    }


def fp16_verdicts(records, baseline: str = "post_ln"):
    """Each fp16.py record's ``passed``: it finished with a finite loss and no more
    overflows than the ``baseline`` row's."""
    base = next((r for r in records if r["row"] == baseline), None)
    for r in records:
        finite = r["train_loss"] is not None and r["train_loss"] == r["train_loss"] and r["train_loss"] != float("inf")
        ok = r["exit_code"] == 0 and not r["min_scale_reached"] and finite
        r["baseline_overflows"] = base["overflows"] if base else None
        r["passed"] = bool(ok and (base is None or r["overflows"] <= base["overflows"]))
    return records
