"""Sublayer connections: how a sublayer's output F is combined with its input x, every
kind and its parts.

Every Transformer sublayer (self-attention, encoder-decoder attention, FFN) of every
kind is run in the same two steps (:class:`SublayerConnection`)::

    branch_input, carry = connection.read(x)
    x = connection.write(x, dropout(sublayer(branch_input)), layer_input, carry)

A connection owns its normalizations, gates and constants, so the encoder and decoder
layers hold one connection per sublayer and never branch on the kind. Shapes: ``x`` is
``(seq_len, batch, embed_dim)`` (``(seq_len, batch, n, embed_dim)``, n streams, for
Hyper-Connections and mHC), the sublayer's input and output ``(seq_len, batch,
embed_dim)``; every gate is computed per position, so a step of incremental decoding sees
exactly what the full forward sees.

The package, by job:

* :mod:`~resnmt.connections.spec`: the registry of kinds and
  :class:`ConnectionSpec`, one side's resolved and validated choices (flags are
  declared with :class:`resnmt.options.Option`);
* :mod:`~resnmt.connections.plugins`: the user's own kinds (an installed package's entry
  point, registered on import; a module or file named by ``--connections`` or
  ``RESNMT_CONNECTIONS``, imported by :func:`load_user_kinds` when arguments are parsed);
* :mod:`~resnmt.connections.norms`: ``--normalization``, every norm a kind or a stack owns;
* :mod:`~resnmt.connections.base`: :class:`SublayerConnection`, what every kind
  is, and the forms several kinds share;
* :mod:`~resnmt.connections.streams`: what a stack carries from layer to layer for the
  kinds that cross layers (ResiDual, DLCL, DenseFormer);
* the kinds, one class each: :mod:`~resnmt.connections.classic` (post-LN,
  pre-LN), :mod:`~resnmt.connections.rskip` (the rSkip paper's),
  :mod:`~resnmt.connections.gated` (SAS and its gates, highway),
  :mod:`~resnmt.connections.deep` (DeepNorm, ReZero, Admin, Peri-LN),
  :mod:`~resnmt.connections.cross_layer` (B2T, ResiDual, DLCL, DenseFormer),
  :mod:`~resnmt.connections.depth_norm` (Mix-LN, LayerNorm Scaling, HybridNorm and its
  attention), :mod:`~resnmt.connections.hyper` (Hyper-Connections, with its stream) and
  :mod:`~resnmt.connections.mhc` (mHC).

**The registry is the one list of kinds**, in this order (the table is generated from
it):

<!-- kind-docstring-table:begin -->
===========  =====================================================================================================================
kind         output y
===========  =====================================================================================================================
post_ln      LN(x + F)
pre_ln       x + F(LN(x)), a final LN after each stack
xskip        λ·x + F, no normalization
xskip_ln     LN(λ·x + F), --skip-lambda-learned: λ a learned vector
rskip_ln     y₁ = LN₁(x + F), y_k = LN_k(x + y_{k-1}), output y_λ, λ an integer ≥ 1
sas          α·x + β·F + γ·LN(x + F), α, β learned gates, γ = (1-α)(1-β) (--sas-gamma gate: a third gate)
highway      t·F + (1-t)·x, t = σ(x W_T + b_T)
deepnorm     LN(α·x + F), α and the init's β from the depths
rezero       x + a·F, a learned from 0, no LayerNorm
admin        LN(ω ⊙ x + F), ω learned, initialised from the depth
peri_ln      x + LN_out(F(LN_in(x))), a final LN after each stack
b2t          LN(h + F(h) + x₀), post-LN; a layer's last LN also takes the layer's input x₀
resi_dual    x_N + LN(d), d = x₀ + ΣF, post-LN sublayers; d adds every sublayer's F
dlcl         x_l = Σ_{k<l} W[l,k]·LN(y_k), pre-LN layers; W learned from the average
dlcl_post    x_l = LN(Σ_{k<l} W[l,k]·y_k), post-LN layers; W learned from the average
denseformer  Y_i = Σ_{j≤i} α_ij·X_j, pre-LN blocks; X₀ the embedding, α from the identity
mix_ln       LN(x + F) if l < ⌊αL⌋, else x + F(LN(x)), α = --mix-ln-fraction; a final LN after each stack
ln_scaling   x + F(LN(x)/√ℓ), pre-LN, ℓ the 1-based block index; a final LN after each stack
hybrid_norm  x + Attn_QKV(x); Norm(x) + FFN(Norm(x)), Q, K, V normalized per head (self and cross); a final LN after each stack
hyper        H ← A_rᵀH + Bᵀ·F(LN(A_mᵀH)), n streams (--hc-streams); H⁰ = n copies of x₀, output ΣH then the final LN
mhc          H ← H_res·H + H_postᵀ·F(LN(H_pre·H)), H_res = SK(·), n streams (--hc-streams); H_pre, H_post sigmoids; Sinkhorn-Knopp
===========  =====================================================================================================================
<!-- kind-docstring-table:end -->

Every normalization a kind owns is ``--normalization`` (LayerNorm, RMSNorm or DyT;
:mod:`resnmt.connections.norms`). B2T's last connection of a layer also adds the layer's
input (its ``write``); ResiDual, DLCL, DenseFormer and the multi-stream kinds add a
:class:`~resnmt.connections.streams.ResidualStream` that the stack carries from layer to
layer (``build_stream``).
"""
from resnmt.connections.spec import (  # noqa: F401
    CONNECTION_CLASSES,
    CONNECTION_FLAGS,
    ConnectionConfigError,
    ConnectionSpec,
    Statistic,
    check_flags_used,
    connection_class,
    register_connection,
)
from resnmt.connections.base import (  # noqa: F401
    FFN_IN,
    FFN_OUT,
    KEY,
    OUTPUT,
    QUERY,
    VALUE,
    ScaledSkipConnection,
    SublayerConnection,
    build_attention,
    build_connection,
    build_stream,
)
# the kinds, registered in this order (the order of --residual's choices and of every kind table)
from resnmt.connections.classic import PostLNConnection, PreLNConnection  # noqa: F401
from resnmt.connections.rskip import RSkipLNConnection, XSkipConnection, XSkipLNConnection  # noqa: F401
from resnmt.connections.gated import HighwayConnection, SASConnection  # noqa: F401
from resnmt.connections.deep import (  # noqa: F401
    AdminConnection,
    DeepNormConnection,
    PeriLNConnection,
    ReZeroConnection,
    admin_omega,
    deepnorm_constants,
)
from resnmt.connections.cross_layer import (  # noqa: F401
    B2TConnection,
    DLCLConnection,
    DLCLPostConnection,
    DenseFormerConnection,
    ResiDualConnection,
)
from resnmt.connections.depth_norm import HybridNormConnection, LNScalingConnection, MixLNConnection  # noqa: F401
from resnmt.connections.hyper import HyperConnection  # noqa: F401
from resnmt.connections.mhc import ManifoldHyperConnection  # noqa: F401

CONNECTION_KINDS = BUILTIN_KINDS = tuple(CONNECTION_CLASSES)  # the built-in kinds (the tables, the study)

# the kinds of installed packages (their entry points), after every built-in one; the user's
# modules of RESNMT_CONNECTIONS and --connections are imported when fairseq parses the
# arguments, or at the look-up of a name not registered (resnmt.connections.plugins)
from resnmt.connections.plugins import import_connections, load_entry_points, load_user_kinds  # noqa: E402, F401

load_entry_points()
