"""resnmt: selectable sublayer connections and normalized activations for fairseq.

Load with ``fairseq-train --user-dir resnmt`` (or ``import resnmt``): importing the
package registers the ``resnmt_transformer`` model, its named architectures
(``transformer_sas_base`` ...), the connection kinds (built in, and those of installed
packages), the ``resnmt_translation`` task and the ``adam_fused`` optimizer (fairseq's
``adam`` in multi-tensor kernels), and applies resnmt's patches of fairseq, torch and the
standard library, each listed with what it changes and why in ``resnmt.fairseq_patches``
(checkpoints that load under torch's ``weights_only``, float32 master weights kept in
``--fp16``/``--bf16`` checkpoints, a clean exit mid-epoch, third-party deprecation notices
hidden ...). It reads neither the command line nor the environment: the user's own kinds
(``--connections``, ``RESNMT_CONNECTIONS``) are imported when fairseq parses the arguments,
or when a name not registered is looked up (``resnmt.connections.plugins``). What needs
fairseq or torch happens as soon as that library is loaded (``resnmt.plugin``), so that
data preparation (``resnmt.data``) imports neither.

``resnmt.from_pretrained(checkpoint_dir, checkpoint_file=..., data_name_or_path=...)``
loads a checkpoint for translation from Python (fairseq's hub interface; ``resnmt.hub``).

The package, from the ground up: ``options``, ``atomic`` and ``progress`` (an option's
declaration and the closest names to a bad value, files written whole, durations as text:
the standard library alone); ``connections`` (the sublayer connections and their norms),
``activations`` (the FFN activations), as ``nn`` modules (their elementwise chains compiled
for ``--fused-connections`` by ``training.compile``); ``models`` (the model, its flags resolved once,
the named archs) and ``tasks`` (the task); ``training`` (what resnmt adds to fairseq's
training), ``checkpoints`` (averaging them, loading them safely) and ``decoding`` (to
decoding and scoring); ``data`` (preparing a corpus) and ``analysis`` (what a trained model
learned); ``experiment`` (the papers' pipeline, step by step); ``cli`` (the commands, over
all of it). ``plugin`` plugs it into fairseq, ``hub`` loads it from Python.
"""
from resnmt.version import __version__  # noqa: F401
from resnmt import fairseq_patches
from resnmt.plugin import allow_fairseq_checkpoints, plug_into_fairseq, when_imported

fairseq_patches.apply_loaded("python")  # the standard library's: warnings filters, the exit, one-line errors
when_imported({"torch": allow_fairseq_checkpoints, "fairseq": plug_into_fairseq})


def __getattr__(name):
    if name == "from_pretrained":  # translate from Python (resnmt.hub), fairseq imported on first use
        from resnmt.hub import from_pretrained

        return from_pretrained
    raise AttributeError(f"module 'resnmt' has no attribute '{name}'")
