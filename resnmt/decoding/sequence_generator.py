"""Beam search with the GNMT length penalty the papers decoded with.

The papers (tensor2tensor, GNMT: Wu et al. 2016, eq. 14) rank finished hypotheses by

    score(Y) = log P(Y | X) / lp(Y),    lp(Y) = ((5 + |Y|) / 6) ** alpha

with alpha = 0.6 and beam 4, whereas fairseq's ``--lenpen`` ranks them by
``log P(Y | X) / |Y| ** lenpen``. The two disagree on which of a short and a long
hypothesis wins (see ``tests/test_length_penalty.py``).

Why rescoring after the search is exact for fairseq's beam search (fairseq 0.12,
``fairseq/sequence_generator.py``): ``normalize_scores``/``len_penalty`` are read
in exactly one place, ``finalize_hypos``, which divides the score of a hypothesis
that has just ended by ``(step + 1) ** len_penalty`` *after* its positional scores
were computed. Candidates are chosen (``search.step``) from the raw cumulative
log-probabilities, EOS candidates are finalized by their rank among the raw
candidates, and a sentence stops when ``beam_size`` hypotheses have ended
(``is_finished`` counts them, it never compares scores). The normalized score only
feeds the final sort. So running with ``normalize_scores=False`` and then dividing
each finalized hypothesis's raw score by the GNMT penalty and re-sorting gives
exactly "fairseq's beam search ranked with the GNMT penalty".

|Y| counts the EOS token, as both frameworks do: fairseq's length is ``step + 1``
for a hypothesis whose EOS was produced at ``step`` (its ``tokens`` hold the EOS),
and tensor2tensor's ``beam_search.py`` uses ``(5 + (i + 1)) / 6`` where the token
decoded at loop index ``i`` (EOS for a finished hypothesis) is the ``i + 1``-th.

This is not tensor2tensor's search, which also uses the penalty while searching:
it keeps the ``beam_size`` best *penalized* finished hypotheses over all steps
(any EOS among the top ``2 * beam_size`` candidates can enter, and a later, better
one can replace an earlier one), and it stops only at the maximum length or once
no alive hypothesis, even with the largest possible penalty, can beat the worst
finished one. fairseq finalizes only EOS candidates ranked within the top
``beam_size`` and stops a sentence as soon as ``beam_size`` hypotheses have ended.
With alpha > 0 (which favours longer outputs) tensor2tensor may therefore return a
longer hypothesis that fairseq never finishes; the scores of any hypothesis both
searches return are identical.
"""
import functools
from typing import Dict, List

import torch
from torch import Tensor

from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

LENPEN_FORMS = ("fairseq", "gnmt")


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """GNMT's ``((5 + length) / 6) ** alpha`` (``length`` includes the EOS token)."""
    return ((5.0 + length) / 6.0) ** alpha


def rescore_gnmt(
    finalized: List[List[Dict[str, Tensor]]], alpha: float
) -> List[List[Dict[str, Tensor]]]:
    """Divide each hypothesis's raw score by the GNMT penalty and re-sort each n-best list.

    Args:
        finalized: fairseq's output, one list of hypotheses per sentence; each
            hypothesis's ``score`` must be its *unnormalized* summed log-probability
            (a generator built with ``normalize_scores=False``) and ``tokens``
            (1-D, ending with EOS) gives |Y| = ``tokens.numel()``.
        alpha: the exponent (``--lenpen``).

    Returns:
        the same lists, modified in place: ``score`` replaced by the penalized score
        (same dtype and device) and hypotheses sorted best first (stable for ties).
    """
    for sent, hypos in enumerate(finalized):
        for hypo in hypos:
            penalty = gnmt_length_penalty(hypo["tokens"].numel(), alpha)
            hypo["score"] = hypo["score"] / penalty
        finalized[sent] = sorted(hypos, key=lambda h: float(h["score"]), reverse=True)
    return finalized


class GNMTLengthPenaltyMixin:
    """Makes a fairseq SequenceGenerator rank its finished hypotheses by the GNMT penalty.

    Takes the usual generator arguments; ``len_penalty`` is alpha. The search runs
    unnormalized (``normalize_scores=False``, see the module docstring for why that
    leaves the search itself unchanged) and ``generate``/``forward`` rescore the
    result. ``normalize_scores=False`` from the caller (``--unnormalized``) turns
    the penalty off altogether, as it does for fairseq's own penalty.
    """

    def __init__(self, *args, **kwargs):
        apply_penalty = kwargs.pop("normalize_scores", True)
        alpha = kwargs.get("len_penalty", 1.0)
        super().__init__(*args, normalize_scores=False, **kwargs)
        self.gnmt_alpha = float(alpha)
        self.gnmt_apply = bool(apply_penalty)

    def _gnmt(self, finalized):
        return rescore_gnmt(finalized, self.gnmt_alpha) if self.gnmt_apply else finalized

    @torch.no_grad()
    def forward(self, sample, prefix_tokens=None, bos_token=None):
        return self._gnmt(super().forward(sample, prefix_tokens, bos_token=bos_token))

    @torch.no_grad()
    def generate(self, models, sample, **kwargs):
        # SequenceGeneratorWithAlignment.generate calls SequenceGenerator._generate
        # directly, so the rescoring hooks the public entry points, not _generate.
        return self._gnmt(super().generate(models, sample, **kwargs))


@functools.lru_cache(maxsize=None)
def with_gnmt_penalty(seq_gen_cls):
    """The GNMT-ranked subclass of a fairseq SequenceGenerator class (one class per class,
    so tasks that pick their own generator class get it ranked the same way)."""
    if issubclass(seq_gen_cls, GNMTLengthPenaltyMixin):
        return seq_gen_cls
    if not issubclass(seq_gen_cls, SequenceGenerator):
        raise TypeError(
            f"--lenpen-form gnmt needs a fairseq SequenceGenerator subclass, got {seq_gen_cls.__name__}"
        )
    return type(f"GNMT{seq_gen_cls.__name__}", (GNMTLengthPenaltyMixin, seq_gen_cls),
                {"__doc__": f"fairseq's {seq_gen_cls.__name__} ranked by log P(Y|X) / ((5 + |Y|) / 6) ** alpha."})


GNMTSequenceGenerator = with_gnmt_penalty(SequenceGenerator)
GNMTSequenceGeneratorWithAlignment = with_gnmt_penalty(SequenceGeneratorWithAlignment)  # --print-alignment
