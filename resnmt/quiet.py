"""Hide the deprecation notices fairseq 0.12 causes in its dependencies, and nothing else.

fairseq builds its configuration with hydra's old API (``hydra.experimental``
``initialize``/``compose``, ``strict=``, ``# @package _group_`` headers, schemas matched
by name), so every command that converts its arguments (``fairseq-train``,
``fairseq-generate``, ``resnmt-train`` ...) opens with about 24 lines of hydra
``UserWarning``s about hydra's 1.1-1.4 migrations; and it calls torch APIs that torch
has deprecated since (``torch.cuda.amp.autocast(...)`` in every training step, masks of
mixed types in ``multi_head_attention_forward``). Nobody running resnmt can act on
them. ``hide_third_party_deprecations`` ignores exactly those, by category and the
module that raises them (by their text where the module is not telling):

* ``UserWarning``s raised from hydra's modules (``Hydra14MigrationWarning`` included),
  and the one about schema matching that hydra attributes to no module (``sys:1``);
* torch's ``FutureWarning`` that ``torch.cuda.amp.X(args...)`` is deprecated, raised
  from fairseq's modules;
* torch's ``UserWarning`` that mismatched ``key_padding_mask`` and ``attn_mask`` types
  are deprecated (``torch.nn.functional``).

Every other warning is shown as before. ``import resnmt`` installs the filters, so they
apply to resnmt's commands and to fairseq's commands run with ``--user-dir resnmt``
(fairseq imports the user directory before it composes its configuration).
"""
import warnings

# (message regex, category, module regex); warnings.filterwarnings matches both from
# their start (the message case-insensitively), so the module regexes end the name
THIRD_PARTY_DEPRECATIONS = (
    # hydra.core.utils.deprecation_warning attributes its warnings to the hydra module calling it ...
    ("", UserWarning, r"hydra(\.|$)"),
    # ... except this one, raised with a stacklevel deeper than the stack
    (r"\s*'[^']*' is validated against ConfigStore schema with the same name", UserWarning, ""),
    (r"`torch\.cuda\.amp\.\w+\(args\.\.\.\)` is deprecated", FutureWarning, r"fairseq(\.|$)"),
    (r"Support for mismatched key_padding_mask and attn_mask is deprecated", UserWarning, r"torch\.nn\.functional$"),
)


def hide_third_party_deprecations() -> None:
    """Install the filters of THIRD_PARTY_DEPRECATIONS (idempotent: ``filterwarnings``
    moves a filter that is already there to the front instead of adding it twice)."""
    for message, category, module in THIRD_PARTY_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
