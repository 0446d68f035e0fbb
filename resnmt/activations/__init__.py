"""The activation between fc1 and fc2 of every FFN sublayer.

* :mod:`~resnmt.activations.ffn`: the one call signature every FFN activation has,
  ``activation(h, padding_mask)``, fairseq's ``--activation-fn`` behind it, and the
  factory that picks each FFN's activation;
* :mod:`~resnmt.activations.normalized`: NReLU and NSwish (``--normalized-activation``),
  their :class:`~resnmt.activations.normalized.ActivationSpec` and checks;
* :mod:`~resnmt.activations.native`: the CPU kernel of ``--fused-connections`` for
  NReLU/NSwish with per-token statistics (``csrc/normalized_activation.cpp``, compiled on
  first use).
"""
