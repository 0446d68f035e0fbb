"""Checkpoints: what resnmt does with the files fairseq-train writes.

* ``averaging``: the last N epoch or update checkpoints averaged (``resnmt-average``, and
  resnmt-experiment's average step), each file checked before any is loaded, the result
  written atomically (``resnmt.atomic``, shared with data preparation);
* ``compat``: the types fairseq checkpoints hold allow-listed for torch's ``weights_only``
  loading (training's resume, decoding and averaging alike).

This package imports nothing itself: averaging loads with torch alone, without fairseq.
"""
