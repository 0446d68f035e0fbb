"""resnmt: selectable sublayer connections and normalized activations for fairseq.

Load with ``fairseq-train --user-dir resnmt`` (or ``import resnmt``): importing the
package registers the ``resnmt_transformer`` model, its named architectures
(``transformer_sas_base`` ...), the ``resnmt_translation`` task, and allow-lists the
types fairseq checkpoints hold so that they load under torch's ``weights_only``.
"""
from resnmt.version import __version__
from resnmt.checkpoint_compat import allow_fairseq_checkpoints

allow_fairseq_checkpoints()

from resnmt import models  # noqa: E402,F401  (registers the model and archs)
from resnmt import tasks  # noqa: E402,F401  (registers resnmt_translation)
