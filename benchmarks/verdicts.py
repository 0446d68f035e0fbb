"""The benchmarks' verdicts, each named for what it judges: a measured ratio against its
target (``target_verdict``: pass or MISS), gpu_train.py's rows against their targets
(``trainer_verdict``), whether a kind trains in half precision (``fp16_verdicts``, from what
``fp16_log_record`` reads of fairseq's log), and a paper's claim against the seeds of the
curves study (``claim_verdict``: yes, no or mixed).
"""
from rows import Comparison


# SAS rows: measured training ratio over the one the gates' multiply-adds predict (the
# SAS overhead table); 0.95 where no issue set another.
PREDICTION_TARGETS = {"sas (gate h) fused": 1.0}
PREDICTION_TARGET_DEFAULT = 0.95


def target_verdict(value, target, higher_is_better=True):
    """``pass`` or ``MISS`` of a measured ratio against its target ("" without either)."""
    if target is None or value is None:
        return ""
    ok = value >= target if higher_is_better else value <= target
    return "pass" if ok else "MISS"


def trainer_verdict(c: Comparison, rec: dict) -> dict:
    """gpu_train.py's verdict on a row's training ratio to its reference (``rec``: its
    ``ratio`` with min, max and spread over rounds, and ``flops_ratio``): the ``target`` as
    text and whether it ``meets`` it; for a same-math pair also whether the measurement
    ``resolves`` 2 % (spread and ratio range under 2 %)."""
    if c.times:
        return {"target": f">= {c.times:g}x {c.reference.replace('_', ' ')}", "meets": rec["ratio"] >= c.times}
    if c.band:
        lo, hi = c.band
        resolves = rec["spread"] < 0.02 and rec["ratio_max"] - rec["ratio_min"] < 0.02
        return {"target": f"{lo}-{hi}", "meets": lo <= rec["ratio"] <= hi, "resolves": resolves}
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


# A claim of matching (≥) holds for a seed within this many BLEU below its reference: the
# spread of one row's own seeds at 2+2 (0.3-0.6), as the cross-layer table counts level.
LEVEL = 0.5


def claim_verdict(diffs: list, at_least: bool = False) -> str:
    """``yes`` when every seed is ahead (a claim of matching: no seed more than
    :data:`LEVEL` behind), ``no`` when every seed is behind (by more than :data:`LEVEL`),
    else ``mixed``; ``(1 seed)`` where one seed is all there is."""
    holds = [d >= -LEVEL if at_least else d > 0 for d in diffs]
    fails = [d < -LEVEL if at_least else d < 0 for d in diffs]
    word = "yes" if all(holds) else "no" if all(fails) else "mixed"
    return word + (" (1 seed)" if len(diffs) == 1 else "")
