"""``fairseq-generate --scoring token_bleu``: fairseq's own BLEU (``--scoring bleu``) whose
closing line says that it is not the papers' score.

fairseq-generate ends its output with ``Generate test with beam=4: BLEU4 = ...``, BLEU over
the tokens of its dictionary (subword pieces, or the post-processed words split on spaces),
which no paper reports; resnmt-evaluate scores the same output as the papers do
(docs/decoding-and-evaluation.md). resnmt's decoding step (resnmt.experiment.steps.decode)
asks for this scorer, so that its output carries one unlabelled score: none.
"""
from fairseq.scoring import register_scorer
from fairseq.scoring.bleu import BleuConfig, Scorer

LABEL = "(fairseq's BLEU over its dictionary's tokens: not the papers' score, which resnmt-evaluate gives)"


@register_scorer("token_bleu", dataclass=BleuConfig)
class TokenBleu(Scorer):
    """fairseq's ``bleu`` scorer, its result labelled."""

    def result_string(self, order=4):
        return f"{super().result_string(order)} {LABEL}"
