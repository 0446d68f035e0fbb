"""Deployment exports of a trained resnmt (or fairseq) translation model.

* :mod:`resnmt.export.checkpoint`: the model loaded from its checkpoint and dictionaries;
* :mod:`resnmt.export.ctranslate2`: a CTranslate2 model, for the kinds CTranslate2's
  Transformer computes exactly (and one line saying why not for the others);
* :mod:`resnmt.export.torch_program`: the encoder and one decoder step as ``torch.export``
  programs, for every kind, with the beam search that decodes with them
  (:mod:`resnmt.export.runner`, which imports torch only).

``resnmt-export`` (:mod:`resnmt.cli.export`) is the command.
"""


class ExportError(ValueError):
    """A model (or a request) that an export cannot take: one line naming what and why."""
