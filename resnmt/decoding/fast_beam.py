"""Beam search for resnmt models that returns fairseq's hypotheses and scores, faster.

fairseq-generate's search (``fairseq.sequence_generator.SequenceGenerator``) spends about as
much time on its bookkeeping as on the model, and its decoder cache grows by concatenation
and is copied whole at every step. This module runs *the same search* (the same candidates,
the same finished hypotheses, the same scores up to float rounding) in two parts:

* a **stepper**, the model seen one step at a time: ``encode(src_tokens, src_lengths,
  max_len, beam) -> state`` and ``step(tokens, state, order, beam) -> log-probabilities``,
  ``tokens`` the last token of each of the N = sentences x beam hypotheses, ``order`` (N,)
  the hypotheses of the previous step each continues (indices into the previous step's N;
  None at the first step). :class:`ResNMTStepper` is a resnmt model's: the self-attention
  keys and values in one preallocated buffer per model (written in place at each step;
  reordered with one ``index_select``), the encoder-decoder keys and values computed once
  per batch; the attentions with fairseq's own arithmetic (so the scores are fairseq's bit
  for bit), or ``scaled_dot_product_attention`` (``sdpa=True``: each sentence's beam one
  block of queries over its keys, held once per sentence; scores within float rounding);
  everything else (the connections, the residual stream, the FFN and its activation, the
  norms) the model's own modules, so every kind, a user's own included, decodes as its full
  forward computes.
* :func:`beam_search`, fairseq 0.12's ``SequenceGenerator._generate`` with ``BeamSearch``
  rewritten on batched tensors: no Python loop over sentences or hypotheses inside a step,
  finished hypotheses kept in tensors. The rules are fairseq's: ``2 * beam`` candidates per
  sentence, an EOS finalized only among the first ``beam`` and not from a hypothesis already
  ignored, a sentence done when ``beam`` hypotheses have ended (or at the maximum length),
  then dropped from the batch; ``max_len = min(int(a * src_len + b), max_positions - 1)``
  with ``src_len`` the batch's padded source length (as fairseq: a batch's limit); ``min_len``,
  ``--unkpen`` and ``--temperature`` as fairseq applies them; scores normalized by
  ``(step + 1) ** lenpen`` unless ``--unnormalized``. ``--no-repeat-ngram-size`` blocks a
  token that would repeat an n-gram of the hypothesis, as fairseq documents it and its CUDA
  kernel does; fairseq 0.12's Python path (the CPU's, and the GPU's when the kernel is not
  built) is given the whole token buffer, compares the last n-1 entries (padding) with the
  hypothesis and so blocks nothing: with that option the two differ on the CPU.

:class:`FastSequenceGenerator` is a fairseq ``SequenceGenerator`` whose search is this one,
built by the ``resnmt_translation`` task (``--beam-search fast``, the default) for
``fairseq-generate``, ``fairseq-interactive``, the hub's ``translate`` and the study's
milestones; ``--lenpen-form gnmt`` ranks its hypotheses as it ranks fairseq's
(:mod:`resnmt.decoding.sequence_generator`). What it does not implement (sampling, diverse
or constrained search, prefix tokens, ensembles, alignments, ...) is named by
:func:`unsupported_options` and decoded by fairseq's own search, with one line saying so.

Use from Python (a checkpoint)::

    from resnmt.decoding.fast_beam import ResNMTStepper, SearchOptions, beam_search
    stepper = ResNMTStepper(model.eval())
    hypos = beam_search(stepper, src_tokens, src_lengths, SearchOptions(beam=4), tgt_dict)
"""
import logging
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq import search
from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules.multihead_attention import MultiheadAttention
from fairseq.sequence_generator import SequenceGenerator
from torch import Tensor

logger = logging.getLogger(__name__)

FAST = "resnmt's fast beam search (resnmt/decoding/fast_beam.py)"
BEAM_SEARCHES = ("fast", "fairseq")


@dataclass(frozen=True)
class SearchOptions:
    """fairseq-generate's options of the search (their names without dashes)."""

    beam: int = 5
    max_len_a: float = 0.0
    max_len_b: int = 200
    max_len: int = 0  # the model's limit on output positions (0: the stepper's max_positions)
    min_len: int = 1
    normalize_scores: bool = True
    lenpen: float = 1.0
    unkpen: float = 0.0
    temperature: float = 1.0
    no_repeat_ngram_size: int = 0


# ----------------------------------------------------------------------------------- the stepper


@dataclass
class StepState:
    """What a :class:`ResNMTStepper` carries between steps (all of it tensors, but ``length``)."""

    cross_k: List[Tensor]  # per decoder layer: (B, H, S, d), one per sentence (not per hypothesis)
    cross_v: List[Tensor]
    cross_mask: Optional[Tensor]  # (B, 1, 1, S), True where attended (None: no padding)
    cache: Optional[Tensor]  # (L, 2, N, H, capacity, d): every layer's self-attention keys and values
    length: int  # positions written in the cache
    beam: int
    spare: Optional[Tensor] = None  # a second buffer of the cache's shape, which a reorder fills
    logits: Optional[Tensor] = None  # (N, V): each step's logits, then log-probabilities, in place
    output_weight: Optional[Tensor] = None  # (C, V): the output projection, transposed once per batch
    qkv: Optional[List[Optional[Tuple[Tensor, Optional[Tensor]]]]] = None  # per layer: Q, K, V projections in one


def fused_qkv(att) -> Optional[Tuple[Tensor, Optional[Tensor]]]:
    """The weight and bias of ``att``'s Q, K and V projections stacked (one matrix product per
    step instead of three), where all three are plain ``nn.Linear`` (else None: HybridNorm's
    per-head normalized projections, quantization noise)."""
    projections = (att.q_proj, att.k_proj, att.v_proj)
    if any(type(p) is not torch.nn.Linear for p in projections):
        return None
    biases = [p.bias for p in projections]
    if any(b is None for b in biases) and not all(b is None for b in biases):
        return None
    weight = torch.cat([p.weight for p in projections])
    return weight, (torch.cat(biases) if biases[0] is not None else None)


def unsupported_model(model) -> Optional[str]:
    """Why ``model`` cannot run on :class:`ResNMTStepper` (None: it can)."""
    from resnmt.models.encoder_decoder import ResidualTransformerDecoder
    from resnmt.models.layers import ResidualDecoderLayer

    decoder = getattr(model, "decoder", None)
    if not isinstance(decoder, ResidualTransformerDecoder):
        return f"the model's decoder is {type(decoder).__name__}, not resnmt's"
    if decoder.adaptive_softmax is not None:
        return "the decoder has an adaptive softmax"
    for layer in decoder.layers:
        if type(layer) is not ResidualDecoderLayer:
            return f"a decoder layer is {type(layer).__name__} (wrapped or replaced)"
        attentions = [("self", layer.self_attn)] + ([("cross", layer.encoder_attn)] if layer.encoder_attn is not None
                                                    else [])
        for name, att in attentions:
            if not isinstance(att, MultiheadAttention) or type(att).forward is not MultiheadAttention.forward:
                return f"the decoder's {name}-attention is {type(att).__name__}"
            if att.bias_k is not None or att.add_zero_attn:
                return f"the decoder's {name}-attention adds a bias or zero key/value"
    return None


class ResNMTStepper:
    """A resnmt model (``ResNMTTransformerModel``, any kind) one decoding step at a time; see
    the module docstring. ``model`` in eval mode (dropout off), as fairseq's generator puts it."""

    def __init__(self, model, sdpa: bool = False):
        reason = unsupported_model(model)
        if reason is not None:
            raise ValueError(f"the fast beam search cannot decode this model: {reason}")
        self.model = model
        self.sdpa = sdpa  # attention by scaled_dot_product_attention (else fairseq's arithmetic, to the bit)
        self.decoder = model.decoder
        self.layers = list(self.decoder.layers)
        first = self.layers[0].self_attn
        self.heads, self.head_dim = first.num_heads, first.head_dim
        self.max_positions = model.max_decoder_positions()
        self._positions: Optional[Tensor] = None

    # -- encoder
    def encode(self, src_tokens: Tensor, src_lengths: Tensor, max_len: int, beam: int = 1) -> StepState:
        """The encoder's output as each decoder layer's encoder-decoder keys and values: per
        sentence (B, H, S, d) with ``sdpa``; else per hypothesis, (B * beam, H, S, d), computed
        as fairseq computes them (its generator repeats the encoder's output per hypothesis)."""
        out = self.model.encoder(src_tokens, src_lengths=src_lengths)
        memory = out["encoder_out"][0]  # S, B, C
        mask = out["encoder_padding_mask"][0] if out["encoder_padding_mask"] else None
        S, B, _ = memory.shape
        if not self.sdpa:
            memory = memory.index_select(1, torch.arange(B, device=memory.device).repeat_interleave(beam))
        H, d = self.heads, self.head_dim
        cross_k, cross_v = [], []
        for layer in self.layers:
            att = layer.encoder_attn
            if att is None:
                cross_k.append(memory.new_empty(0))
                cross_v.append(memory.new_empty(0))
                continue
            k, v = att.k_proj(memory), att.v_proj(memory)
            if self.sdpa:
                cross_k.append(self._heads(k).contiguous())
                cross_v.append(self._heads(v).contiguous())
            else:  # laid out as fairseq's MultiheadAttention keeps them: (N, H, S, d), a view
                rows = memory.size(1)
                cross_k.append(k.contiguous().view(S, rows * H, d).transpose(0, 1).view(rows, H, S, d))
                cross_v.append(v.contiguous().view(S, rows * H, d).transpose(0, 1).view(rows, H, S, d))
        cross_mask = None
        if mask is not None and bool(mask.any()):
            cross_mask = (~mask).view(B, 1, 1, S)
        self._position_table(max_len + 1, memory)
        state = StepState(cross_k, cross_v, cross_mask, None, 0, beam=1)
        # the weights as the steps read them, taken per batch (a model that trains between
        # decodings, fairseq-train --eval-bleu, is read as it is now)
        projection = self.decoder.output_projection
        if type(projection) is torch.nn.Linear and projection.bias is None and \
                type(self.decoder).output_layer is TransformerDecoderBase.output_layer:
            state.output_weight = projection.weight.t().contiguous()
        state.qkv = [fused_qkv(layer.self_attn) for layer in self.layers]
        return state

    def _heads(self, x: Tensor) -> Tensor:
        """(T, B, C) -> (B, H, T, d)"""
        T, B, _ = x.shape
        return x.view(T, B, self.heads, self.head_dim).permute(1, 2, 0, 3)

    def _position_table(self, positions: int, like: Tensor) -> None:
        """The decoder's positional embedding of steps 0..positions-1 (fairseq's incremental
        positions: padding_idx + 1 + step), per batch (learned positions may have trained since)."""
        embed = self.decoder.embed_positions
        if embed is None:
            return
        pad = self.decoder.padding_idx
        dummy = torch.full((1, positions), pad + 1, dtype=torch.long, device=like.device)
        self._positions = embed(dummy)[0]  # (positions, C)

    # -- one step
    def step(self, tokens: Tensor, state: StepState, order: Optional[Tensor], beam: int,
             temperature: float = 1.0) -> Tensor:
        """Log-probabilities (N, V), float32, of the next token of each of the N hypotheses
        whose last token is ``tokens`` (N,); ``order`` (N,): the hypothesis of the previous
        step each continues (its N may be larger: sentences done are dropped); ``beam``: the
        hypotheses per sentence; the logits divided by ``temperature`` (fairseq's)."""
        N = tokens.size(0)
        if order is not None:
            self._reorder(state, order, beam)
        elif state.cache is None and self._rows(state) is not None and \
                self._rows(state) * (beam if self.sdpa else 1) != N:
            raise ValueError(f"{N} hypotheses for encoder keys of {self._rows(state)} rows, beam {beam}")
        state.beam = beam
        t = state.length
        self._ensure_capacity(state, N, t + 1, tokens)
        features = self.features(tokens, state, t)
        state.length = t + 1
        return self._log_probs(features, state, temperature)

    def features(self, tokens: Tensor, state: StepState, t: int) -> Tensor:
        """The decoder's output features (N, C) at step ``t`` (the cache written at ``t``)."""
        N = tokens.size(0)
        dec = self.decoder
        x = dec.embed_scale * dec.embed_tokens(tokens.view(N, 1))
        if dec.quant_noise is not None:
            x = dec.quant_noise(x)
        if dec.project_in_dim is not None:
            x = dec.project_in_dim(x)
        if self._positions is not None:
            x += self._positions[t].view(1, 1, -1)
        if dec.layernorm_embedding is not None:
            x = dec.layernorm_embedding(x)
        x = x.transpose(0, 1)  # 1, N, C
        stream = dec.residual_stream
        stream_state = stream.begin(x)
        for index, layer in enumerate(self.layers):
            y, residual_sum = self._layer(layer, index, stream.layer_input(stream_state, index, x), state, t)
            stream_state = stream.after_layer(stream_state, index, y, residual_sum)
            x = y
        x = stream.end(stream_state, x)
        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        x = x.transpose(0, 1)  # N, 1, C
        if dec.project_out_dim is not None:
            x = dec.project_out_dim(x)
        return x[:, 0, :]

    def _log_probs(self, features: Tensor, state: StepState, temperature: float) -> Tensor:
        N = features.size(0)
        if state.output_weight is not None and features.dtype == torch.float32:
            V = state.output_weight.size(1)
            if state.logits is None or state.logits.size(0) < N:
                state.logits = features.new_empty(N, V)
            logits = torch.mm(features, state.output_weight, out=state.logits[:N])
        else:
            logits = self.decoder.output_layer(features).float()
        if temperature != 1.0:
            logits.div_(temperature)
        return torch._log_softmax(logits, -1, False, out=logits)  # in place: the values of F.log_softmax

    def _layer(self, layer, index: int, x: Tensor, state: StepState, t: int) -> Tuple[Tensor, Optional[Tensor]]:
        """``ResidualDecoderLayer.forward`` at one step, its attentions on the buffers."""
        layer_input = x
        h, carry = layer.self_attn_connection.read(x)
        f_self = self._self_attention(layer.self_attn, h, index, state, t)
        x = layer.self_attn_connection.write(x, f_self, layer_input, carry)
        sublayer_outputs = [f_self]
        if layer.encoder_attn is not None and layer.encoder_attn_connection is not None:
            h, carry = layer.encoder_attn_connection.read(x)
            f_cross = self._cross_attention(layer.encoder_attn, h, index, state)
            x = layer.encoder_attn_connection.write(x, f_cross, layer_input, carry)
            sublayer_outputs.append(f_cross)
        x, _, f_ffn = layer.ffn_sublayer(x, layer_input, None)
        sublayer_outputs.append(f_ffn)
        return x, layer.residual_sum(sublayer_outputs)

    def _self_attention(self, att, h: Tensor, index: int, state: StepState, t: int) -> Tensor:
        N = h.size(1)
        H, d = self.heads, self.head_dim
        cache = state.cache
        fused = state.qkv[index] if state.qkv is not None else None
        if fused is not None:
            qkv = F.linear(h, fused[0], fused[1]).view(N, 3, H, d)
            q = qkv[:, 0] * att.scaling
            cache[index, :, :, :, t] = qkv[:, 1:].transpose(0, 1)
        else:
            q = att.q_proj(h)
            q *= att.scaling
            cache[index, 0, :, :, t] = att.k_proj(h).view(N, H, d)
            cache[index, 1, :, :, t] = att.v_proj(h).view(N, H, d)
        capacity = cache.size(4)
        k = cache[index, 0].view(N * H, capacity, d)[:, : t + 1]
        v = cache[index, 1].view(N * H, capacity, d)[:, : t + 1]
        if self.sdpa:
            out = F.scaled_dot_product_attention(q.reshape(N * H, 1, d), k, v, scale=1.0)
        else:  # fairseq's MultiheadAttention's arithmetic, to the bit
            weights = F.softmax(torch.bmm(q.reshape(N * H, 1, d), k.transpose(1, 2)), dim=-1, dtype=torch.float32)
            out = torch.bmm(weights.type_as(q), v)
        return att.out_proj(out.view(1, N, H * d))

    def _cross_attention(self, att, h: Tensor, index: int, state: StepState) -> Tensor:
        N = h.size(1)
        H, d = self.heads, self.head_dim
        beam = state.beam
        B = N // beam
        q = att.q_proj(h)
        q *= att.scaling
        k, v = state.cross_k[index], state.cross_v[index]  # (B, H, S, d)
        if self.sdpa:
            q = q.view(B, beam, H, d).transpose(1, 2)  # each sentence's beam: one block of queries
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=state.cross_mask, scale=1.0)
            return att.out_proj(out.transpose(1, 2).reshape(1, N, H * d))
        # fairseq's MultiheadAttention's arithmetic, to the bit: k and v per hypothesis (N, H, S, d)
        S = k.size(2)
        q = q.contiguous().view(1, N * H, d).transpose(0, 1)
        weights = torch.bmm(q, k.view(N * H, S, d).transpose(1, 2))
        if state.cross_mask is not None:
            weights = weights.view(B, beam, H, 1, S).masked_fill(~state.cross_mask.view(B, 1, 1, 1, S), float("-inf"))
            weights = weights.view(N * H, 1, S)
        weights = F.softmax(weights, dim=-1, dtype=torch.float32).type_as(q)
        out = torch.bmm(weights, v.view(N * H, S, d))
        return att.out_proj(out.transpose(0, 1).contiguous().view(1, N, H * d))

    @staticmethod
    def _rows(state: StepState) -> Optional[int]:
        """How many rows the encoder-decoder keys have (None: no layer attends to the encoder)."""
        return next((k.size(0) for k in state.cross_k if k.numel()), None)

    # -- the buffers
    def _ensure_capacity(self, state: StepState, N: int, needed: int, like: Tensor) -> None:
        cache = state.cache
        if cache is not None and cache.size(4) >= needed:
            return
        capacity = max(16, needed) if cache is None else max(needed, 2 * cache.size(4))
        dtype = self.decoder.embed_tokens.weight.dtype
        new = torch.empty(len(self.layers), 2, N, self.heads, capacity, self.head_dim, dtype=dtype,
                          device=like.device)
        if cache is not None:
            new[:, :, :, :, : state.length] = cache[:, :, :, :, : state.length]
        state.cache, state.spare = new, None

    def _reorder(self, state: StepState, order: Tensor, beam: int) -> None:
        """Keep the hypotheses ``order`` continues, and the sentences they belong to."""
        rows = self._rows(state)
        if rows is not None and order.numel() != rows * (beam if self.sdpa else 1):  # sentences done: dropped
            sentences = order.view(-1, beam)[:, 0] // beam
            kept = sentences if self.sdpa else order  # fairseq's reorder_incremental_state
            state.cross_k = [k.index_select(0, kept) if k.numel() else k for k in state.cross_k]
            state.cross_v = [v.index_select(0, kept) if v.numel() else v for v in state.cross_v]
            state.logits = None if state.logits is None else state.logits[: order.numel()]
            if state.cross_mask is not None:
                state.cross_mask = state.cross_mask.index_select(0, sentences)
        cache = state.cache
        if cache is None or state.length == 0:
            return
        if order.numel() == cache.size(2) and torch.equal(order, torch.arange(order.numel(), device=order.device)):
            return  # every hypothesis continues itself
        shape = cache.shape[:2] + (order.numel(),) + cache.shape[3:]
        spare = state.spare
        if spare is None or spare.shape != shape:
            spare = cache.new_empty(shape)
        torch.index_select(cache, 2, order, out=spare)
        state.cache, state.spare = spare, cache


# ------------------------------------------------------------------------------------- the search


def block_repeated_ngrams(lprobs: Tensor, tokens: Tensor, n: int, step: int, pad: int) -> None:
    """fairseq's ``NGramRepeatBlock`` (its Python path), batched: a token that would complete
    an n-gram already in the hypothesis (``tokens`` (N, step + 1), the initial EOS included)
    gets -inf. Non-matches write -inf into ``pad``'s column, which is -inf already."""
    if step + 1 < n:  # no n-gram yet
        return
    windows = tokens.unfold(1, n, 1)  # N, step + 2 - n, n
    last = tokens[:, step + 2 - n: step + 1]  # the n - 1 tokens the next one would follow
    match = (windows[:, :, : n - 1] == last.unsqueeze(1)).all(dim=2)
    banned = torch.where(match, windows[:, :, n - 1], torch.full_like(windows[:, :, n - 1], pad))
    lprobs.scatter_(1, banned, -math.inf)


def top_candidates(flat: Tensor, k: int, chunk: int = 64) -> Tuple[Tensor, Tensor]:
    """``torch.topk(flat, k)`` (values, indices) of each row, exactly: the k + 1 largest found in
    the k + 1 chunks of ``chunk`` columns with the largest maxima (and the columns after the
    last whole chunk), where any of them lies; where two of those k + 1 values are equal
    (torch.topk orders equal values its own way), torch.topk itself. About 5x faster than
    topk over a beam's 4 x 8,000 log-probabilities."""
    rows, n = flat.shape
    full = n - n % chunk
    if full < 4 * (k + 1) * chunk:
        return torch.topk(flat, k)
    maxima = flat[:, :full].view(rows, full // chunk, chunk).amax(dim=2)
    top_chunks = torch.topk(maxima, k + 1, dim=1)[1]
    index = (top_chunks.unsqueeze(2) * chunk + torch.arange(chunk, device=flat.device)).view(rows, -1)
    if full < n:
        index = torch.cat([index, torch.arange(full, n, device=flat.device).expand(rows, -1)], dim=1)
    values, within = torch.topk(flat.gather(1, index), k + 1, dim=1)
    if not bool((values[:, :-1] > values[:, 1:]).all()):
        return torch.topk(flat, k)
    return values[:, :k], index.gather(1, within[:, :k])


def beam_search(stepper, src_tokens: Tensor, src_lengths: Tensor, options: SearchOptions, tgt_dict,
                ) -> List[List[Dict[str, Tensor]]]:
    """fairseq's beam search (see the module docstring) with ``stepper`` on one batch.

    Returns:
        per sentence, its finished hypotheses best first, as fairseq's generator returns them:
        ``tokens`` (ending with EOS), ``score``, ``positional_scores``, and empty
        ``attention`` and ``alignment``.
    """
    pad, eos, unk = tgt_dict.pad(), tgt_dict.eos(), tgt_dict.unk()
    beam = min(options.beam, len(tgt_dict) - 1)
    bsz, src_len = src_tokens.shape[:2]
    max_positions = options.max_len or stepper.max_positions
    max_len = min(int(options.max_len_a * src_len + options.max_len_b), max_positions - 1)
    if options.min_len > max_len:
        raise ValueError(f"min_len {options.min_len} is larger than the maximum length {max_len}")
    device = src_tokens.device
    state = stepper.encode(src_tokens, src_lengths, max_len, beam)

    tokens = torch.full((bsz * beam, max_len + 2), pad, dtype=torch.long, device=device)
    tokens[:, 0] = eos
    scores = torch.zeros(bsz * beam, max_len + 1, device=device)
    cands_to_ignore = torch.zeros(bsz, beam, dtype=torch.bool, device=device)
    cand_size = 2 * beam
    cand_offsets = torch.arange(cand_size, device=device)
    bbsz_offsets = torch.arange(bsz, device=device).unsqueeze(1) * beam
    # the finished hypotheses, per sentence of the batch as given
    fin_tokens = torch.full((bsz, beam, max_len + 1), pad, dtype=torch.long, device=device)
    fin_pos = torch.zeros(bsz, beam, max_len + 1, device=device)
    fin_scores = torch.full((bsz, beam), -math.inf, device=device)
    fin_len = torch.zeros(bsz, beam, dtype=torch.long, device=device)
    fin_count = torch.zeros(bsz, dtype=torch.long, device=device)
    sentence = torch.arange(bsz, device=device)  # each row's sentence of the batch as given
    order: Optional[Tensor] = None

    for step in range(max_len + 1):
        # at step 0 every hypothesis of a sentence is the same (fairseq reads only the first):
        # one row per sentence
        lprobs = stepper.step(tokens[:, step], state, order, beam, options.temperature)
        lprobs[:, pad] = -math.inf
        if options.unkpen:
            lprobs[:, unk] -= options.unkpen
        if step >= max_len:
            lprobs[:, :eos] = -math.inf
            lprobs[:, eos + 1:] = -math.inf
        if step < options.min_len:
            lprobs[:, eos] = -math.inf
        if options.no_repeat_ngram_size > 0:
            block_repeated_ngrams(lprobs, tokens[:, : step + 1], options.no_repeat_ngram_size, step, pad)

        # fairseq's BeamSearch.step
        vocab = lprobs.size(1)
        if step == 0:
            lp = lprobs.view(bsz, beam, vocab)[:, :1]
        else:
            # in place: lprobs is not read again
            lp = lprobs.view(bsz, beam, vocab).add_(scores.view(bsz, beam, -1)[:, :, step - 1].unsqueeze(-1))
        flat = lp.reshape(bsz, -1)
        cand_scores, cand_flat = top_candidates(flat, min(cand_size, flat.size(1) - 1))
        cand_beams = torch.div(cand_flat, vocab, rounding_mode="trunc")
        cand_indices = cand_flat.fmod(vocab)

        cand_bbsz_idx = cand_beams + bbsz_offsets
        eos_mask = cand_indices.eq(eos) & cand_scores.ne(-math.inf)
        eos_mask[:, :beam] &= ~cands_to_ignore
        ended = eos_mask[:, :beam]
        finished_rows = None
        if bool(ended.any()):
            rank = ended.long().cumsum(dim=1) - 1
            slot = fin_count[sentence].unsqueeze(1) + rank
            keep = ended & (slot < beam)
            rows = sentence.unsqueeze(1).expand_as(keep)[keep]
            slots = slot[keep]
            bbsz = cand_bbsz_idx[:, :beam][keep]
            eos_scores = cand_scores[:, :beam][keep]
            hyp_tokens = tokens.index_select(0, bbsz)[:, 1: step + 2]
            hyp_tokens[:, step] = eos
            pos = scores.index_select(0, bbsz)[:, : step + 1]
            pos[:, step] = eos_scores
            pos[:, 1:] = pos[:, 1:] - pos[:, :-1]
            if options.normalize_scores:
                eos_scores = eos_scores / (step + 1) ** options.lenpen
            fin_tokens[rows, slots, : step + 1] = hyp_tokens
            fin_pos[rows, slots, : step + 1] = pos
            fin_scores[rows, slots] = eos_scores
            fin_len[rows, slots] = step + 1
            fin_count.index_add_(0, rows, torch.ones_like(rows))
            done = ended.any(dim=1) & ((fin_count[sentence] == beam) | (step == max_len))
            if bool(done.any()):
                finished_rows = done
        if finished_rows is not None:
            if bool(finished_rows.all()):
                break
            batch_idxs = (~finished_rows).nonzero().squeeze(1)
            new_bsz = batch_idxs.numel()
            eos_mask = eos_mask[batch_idxs]
            cand_beams = cand_beams[batch_idxs]
            bbsz_offsets = bbsz_offsets[:new_bsz]
            cand_bbsz_idx = cand_beams + bbsz_offsets
            cand_scores = cand_scores[batch_idxs]
            cand_indices = cand_indices[batch_idxs]
            cands_to_ignore = cands_to_ignore[batch_idxs]
            scores = scores.view(bsz, -1)[batch_idxs].view(new_bsz * beam, -1)
            tokens = tokens.view(bsz, -1)[batch_idxs].view(new_bsz * beam, -1)
            sentence = sentence[batch_idxs]
            bsz = new_bsz
        else:
            batch_idxs = None
        if step == max_len:  # fairseq asserts step < max_len here: every sentence ended at max_len
            raise RuntimeError("beam search: sentences left at the maximum length")

        eos_mask[:, :beam] = ~((~cands_to_ignore) & (~eos_mask[:, :beam]))
        active_mask = eos_mask.long() * cand_size + cand_offsets[: eos_mask.size(1)]
        new_cands_to_ignore, active_hypos = torch.topk(active_mask, k=beam, dim=1, largest=False)
        cands_to_ignore = new_cands_to_ignore.ge(cand_size)[:, :beam]
        active_bbsz_idx = torch.gather(cand_bbsz_idx, dim=1, index=active_hypos).view(-1)
        tokens[:, : step + 1] = tokens[:, : step + 1].index_select(0, active_bbsz_idx)
        tokens.view(bsz, beam, -1)[:, :, step + 1] = torch.gather(cand_indices, dim=1, index=active_hypos)
        if step > 0:
            scores[:, :step] = scores[:, :step].index_select(0, active_bbsz_idx)
        scores.view(bsz, beam, -1)[:, :, step] = torch.gather(cand_scores, dim=1, index=active_hypos)
        order = active_bbsz_idx
        if batch_idxs is not None:  # into the previous step's rows, as the stepper holds them
            corr = batch_idxs - torch.arange(batch_idxs.numel(), device=device)
            order = (order.view(-1, beam) + corr.unsqueeze(-1) * beam).view(-1)

    return finalized_lists(fin_tokens, fin_pos, fin_scores, fin_len, fin_count)


def finalized_lists(fin_tokens, fin_pos, fin_scores, fin_len, fin_count) -> List[List[Dict[str, Tensor]]]:
    """The finished hypotheses as fairseq's generator returns them, best first per sentence."""
    _, ranked = torch.sort(fin_scores, dim=1, descending=True, stable=True)
    counts, lengths, ranked_l = fin_count.tolist(), fin_len.tolist(), ranked.tolist()
    empty = fin_scores.new_empty(0)
    out = []
    for s, count in enumerate(counts):
        hypos = []
        for j in ranked_l[s][:count]:
            n = lengths[s][j]
            hypos.append({"tokens": fin_tokens[s, j, :n], "score": fin_scores[s, j], "attention": empty,
                          "alignment": empty, "positional_scores": fin_pos[s, j, :n]})
        out.append(hypos)
    return out


# --------------------------------------------------------------------------------- the generator


def unsupported_options(args) -> List[str]:
    """fairseq-generate's options (as set in ``args``) that the fast search does not implement."""
    checks = [
        ("--sampling", getattr(args, "sampling", False)),
        ("--diverse-beam-groups", getattr(args, "diverse_beam_groups", -1) > 0),
        ("--diversity-rate", getattr(args, "diversity_rate", -1) > -1),
        ("--match-source-len", getattr(args, "match_source_len", False)),
        ("--constraints", getattr(args, "constraints", False)),
        ("--prefix-size", getattr(args, "prefix_size", 0) > 0),
        ("--print-alignment", getattr(args, "print_alignment", False)),
        ("--retain-dropout", getattr(args, "retain_dropout", False)),
        ("--lm-path", getattr(args, "lm_path", None)),
        ("--score-reference", getattr(args, "score_reference", False)),
    ]
    return [flag for flag, used in checks if used]


class FastSequenceGenerator(SequenceGenerator):
    """fairseq's ``SequenceGenerator`` (same arguments, same output) whose beam search is
    :func:`beam_search` over a :class:`ResNMTStepper`; for what the fast search does not
    cover (another search strategy, an ensemble, another model, prefix tokens) fairseq's own,
    said once in the log."""

    def __init__(self, models, tgt_dict, sdpa: bool = False, **kwargs):
        super().__init__(models, tgt_dict, **kwargs)
        self.sdpa = sdpa  # ResNMTStepper's attention: scaled_dot_product_attention (else fairseq's arithmetic)
        self.fallback = self._fallback_reason(models, kwargs)
        self._stepper: Optional[ResNMTStepper] = None
        if self.fallback is None:
            logger.info(f"beam search: {FAST}")
            if getattr(self, "repeat_ngram_blocker", None) is not None:
                logger.info("--no-repeat-ngram-size: n-grams blocked as fairseq documents it and its CUDA kernel "
                            "does (fairseq 0.12's Python path, on the CPU, compares them with padding and blocks none)")
        else:
            logger.info(f"beam search: fairseq's ({self.fallback})")

    @property
    def path(self) -> str:
        """Which search decodes: ``fast`` or ``fairseq``."""
        return "fast" if self.fallback is None else "fairseq"

    def _fallback_reason(self, models, kwargs) -> Optional[str]:
        models = list(models.models) if hasattr(models, "models") else list(models)
        if len(models) != 1:
            return f"an ensemble of {len(models)} models"
        if type(self.search) is not search.BeamSearch:
            return f"the search is {type(self.search).__name__}"
        if self.match_source_len:
            return "--match-source-len"
        if self.lm_model is not None:
            return "a language model is fused"
        if self.token_indices_to_suppress is not None:
            return "tokens to suppress"
        if kwargs.get("eos") is not None and kwargs["eos"] != self.tgt_dict.eos():
            return "another end-of-sentence symbol"
        return unsupported_model(models[0])

    def options(self) -> SearchOptions:
        blocker = getattr(self, "repeat_ngram_blocker", None)
        return SearchOptions(beam=self.beam_size, max_len_a=self.max_len_a, max_len_b=self.max_len_b,
                             max_len=self.max_len, min_len=self.min_len, normalize_scores=self.normalize_scores,
                             lenpen=self.len_penalty, unkpen=self.unk_penalty, temperature=self.temperature,
                             no_repeat_ngram_size=blocker.no_repeat_ngram_size if blocker is not None else 0)

    def _generate(self, sample, prefix_tokens=None, constraints=None, bos_token=None):
        if self.fallback is not None or prefix_tokens is not None or constraints is not None or (
                bos_token is not None and bos_token != self.eos):
            return super()._generate(sample, prefix_tokens=prefix_tokens, constraints=constraints,
                                     bos_token=bos_token)
        model = self.model.models[0]
        if self._stepper is None or self._stepper.model is not model or self._stepper.sdpa != self.sdpa:
            self._stepper = ResNMTStepper(model, sdpa=self.sdpa)
        net_input = sample["net_input"]
        src_tokens = net_input["src_tokens"]
        src_lengths = net_input.get("src_lengths")
        if src_lengths is None:
            src_lengths = (src_tokens.ne(self.eos) & src_tokens.ne(self.pad)).long().sum(dim=1)
        return beam_search(self._stepper, src_tokens, src_lengths, self.options(), self.tgt_dict)
