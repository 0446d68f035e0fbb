"""resnmt: selectable sublayer connections and normalized activations for fairseq.

Load with ``fairseq-train --user-dir resnmt`` (or ``import resnmt``): importing the
package registers the ``resnmt_transformer`` model, its named architectures
(``transformer_sas_base`` ...), the ``resnmt_translation`` task and the ``adam_fused``
optimizer (fairseq's ``adam`` in multi-tensor kernels), allow-lists the
types fairseq checkpoints hold so that they load under torch's ``weights_only``,
lets a training run that stops mid-epoch exit cleanly (``resnmt.prefetch_exit``), and
keeps the float32 master weights of ``--fp16``/``--bf16`` runs in their checkpoints so
that a resumed run continues exactly (``resnmt.bf16``), and hides the deprecation notices
fairseq's calls cause in hydra and torch (``resnmt.quiet``).

``resnmt.from_pretrained(checkpoint_dir, checkpoint_file=..., data_name_or_path=...)``
loads a checkpoint for translation from Python (fairseq's hub interface; ``resnmt.hub``).
"""
from resnmt.version import __version__
from resnmt.checkpoint_compat import allow_fairseq_checkpoints
from resnmt.prefetch_exit import park_prefetch_threads_at_exit
from resnmt.quiet import hide_third_party_deprecations, lower_fairseqs_debug_logging
from resnmt.bf16 import keep_fp32_master_weights

allow_fairseq_checkpoints()
park_prefetch_threads_at_exit()
hide_third_party_deprecations()  # hydra's and torch's notices about fairseq's calls (resnmt.quiet)
keep_fp32_master_weights()

from resnmt import models  # noqa: E402,F401  (registers the model and archs)
from resnmt import tasks  # noqa: E402,F401  (registers resnmt_translation)
from resnmt import optim  # noqa: E402,F401  (registers --optimizer adam_fused)
from resnmt.hub import from_pretrained  # noqa: E402,F401  (translate from Python: resnmt.hub)

lower_fairseqs_debug_logging()  # fairseq's import leaves the root logger at DEBUG (resnmt.quiet)
