"""A translation model of any kind as ``torch.export`` programs: the encoder and the decoder step.

The artifact (a folder) holds three programs, exported with dynamic batch and lengths:

* ``encoder.pt2``: ``src_tokens (B, S)`` (fairseq's left-padded source, EOS last) ->
  ``encoder_out (S, B, C)``, ``padding_mask (B, S)`` (True at padding);
* ``first_step.pt2``: the decoder's first step: ``tokens (N, 1)`` (EOS), ``encoder_out (S, N, C)``,
  ``padding_mask (N, S)`` -> ``log_probs (N, V)``, the self-attention keys and values
  ``(L, N, H, 1, d)`` and the encoder-decoder keys and values ``(L, N, H, S, d)``;
* ``next_step.pt2``: a later step: ``tokens (N, 1)`` (the token each hypothesis decoded
  last), the self-attention keys and values of the t earlier steps, the
  encoder-decoder ones and ``padding_mask`` -> ``log_probs`` and the keys and values of the
  t + 1 steps.

Each program is the model's own modules (its connections, residual stream, norms,
attentions and FFN activation) run through fairseq's incremental decoding, its cache
handed in and out as tensors; so every kind, a user's own included, is exported as it
decodes in fairseq-generate. Beside them: the dictionaries (``dict.src.txt``,
``dict.tgt.txt``), ``config.json`` (the special symbols, the limits) and ``runner.py``
(:mod:`resnmt.export.runner`, which needs torch only): its beam search (fairseq's) decodes
with the programs in a Python without resnmt or fairseq.
"""
import copy
import json
import shutil
from pathlib import Path

import torch
from torch import Tensor, nn

from resnmt.export import ExportError
from resnmt.export import runner

PROGRAMS = ("encoder", "first_step", "next_step")


class TablePositions(nn.Module):
    """fairseq's positional embedding (sinusoidal or learned) as one precomputed table,
    indexed as fairseq indexes it (positions from ``padding_idx + 1``; an incremental step
    at ``padding_idx + its length``), without fairseq's check that the table is long enough,
    whose data-dependent branch a program cannot hold: the artifact refuses longer inputs."""

    def __init__(self, table: Tensor, padding_idx: int):
        super().__init__()
        self.register_buffer("table", table.detach().clone())
        self.padding_idx = padding_idx
        self.max_positions = table.size(0) - padding_idx - 1  # the longest input it covers
        self.step_length = None  # in a step: the hypotheses' length with the token decoded now (set by NextStep)

    def forward(self, input: Tensor, incremental_state=None, timestep=None, positions=None) -> Tensor:
        if incremental_state is not None:
            length = input.size(1) if self.step_length is None else self.step_length
            row = self.table[self.padding_idx + length]
            return row.view(1, 1, -1).expand(input.size(0), 1, -1)
        mask = input.ne(self.padding_idx).int()
        pos = (torch.cumsum(mask, dim=1) * mask).long() + self.padding_idx
        return self.table[pos]


def positions_table(module) -> Tensor:
    """The table of a fairseq positional embedding: the sinusoidal weights, or the learned ones."""
    table = getattr(module, "weights", None)
    return table if table is not None else module.weight


def with_table_positions(stack):
    if stack.embed_positions is not None:
        stack.embed_positions = TablePositions(positions_table(stack.embed_positions), stack.padding_idx)
    stack.static_padding = True  # the padding masks passed whatever the batch holds (no data-dependent branch)


class EncoderProgram(nn.Module):
    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, src_tokens: Tensor):
        lengths = src_tokens.ne(self.encoder.padding_idx).sum(dim=1)
        out = self.encoder(src_tokens, src_lengths=lengths)
        return out["encoder_out"][0], out["encoder_padding_mask"][0]


class StepProgram(nn.Module):
    """One decoder step with fairseq's incremental state given and returned as tensors."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def attentions(self):
        return [layer.self_attn for layer in self.decoder.layers], [layer.encoder_attn for layer in self.decoder.layers]

    def run(self, tokens: Tensor, encoder_out: Tensor, padding_mask: Tensor, state: dict) -> Tensor:
        encoder = {"encoder_out": [encoder_out], "encoder_padding_mask": [padding_mask]}
        out, _ = self.decoder(tokens, encoder_out=encoder, incremental_state=state)
        return torch.log_softmax(out[:, -1, :].float(), dim=-1)

    @staticmethod
    def stacked(modules, state: dict, name: str, n: int) -> Tensor:
        """The cached keys or values of ``modules`` (L, N, H, T, d)."""
        return torch.stack([m._get_input_buffer(state)[name].view(n, m.num_heads, -1, m.head_dim) for m in modules])


class FirstStep(StepProgram):
    def forward(self, tokens: Tensor, encoder_out: Tensor, padding_mask: Tensor):
        state: dict = {}
        log_probs = self.run(tokens, encoder_out, padding_mask, state)
        selfs, crosses = self.attentions()
        n = tokens.size(0)
        return (log_probs, self.stacked(selfs, state, "prev_key", n), self.stacked(selfs, state, "prev_value", n),
                self.stacked(crosses, state, "prev_key", n), self.stacked(crosses, state, "prev_value", n))


class NextStep(StepProgram):
    def forward(self, tokens: Tensor, self_k: Tensor, self_v: Tensor, cross_k: Tensor, cross_v: Tensor,
                padding_mask: Tensor):
        state: dict = {}
        selfs, crosses = self.attentions()
        for i, (s, c) in enumerate(zip(selfs, crosses)):
            s._set_input_buffer(state, {"prev_key": self_k[i], "prev_value": self_v[i]})
            c._set_input_buffer(state, {"prev_key": cross_k[i], "prev_value": cross_v[i],
                                        "prev_key_padding_mask": padding_mask})
        # the encoder-decoder keys and values come from the state: the encoder's output is read for its shape only
        n, source_len = padding_mask.shape
        encoder_out = cross_k.new_zeros(()).expand(source_len, n, crosses[0].kdim)
        positions = self.decoder.embed_positions
        if positions is not None:
            positions.step_length = self_k.size(3) + 1  # tokens holds the last token only
        try:
            log_probs = self.run(tokens, encoder_out, padding_mask, state)
        finally:
            if positions is not None:
                positions.step_length = None
        return log_probs, self.stacked(selfs, state, "prev_key", n), self.stacked(selfs, state, "prev_value", n)


def refusal(model):
    """Why the programs cannot hold ``model`` (one line), or None."""
    decoder = model.decoder
    if getattr(decoder, "adaptive_softmax", None) is not None:
        return "--format torch-export cannot hold an adaptive softmax"
    for layer in decoder.layers:
        if getattr(layer, "encoder_attn", None) is None:
            return "--format torch-export needs encoder-decoder attention in every decoder layer"
    return None


def export_programs(model, task, folder, log=print) -> Path:
    """Write the artifact of ``model`` (eval mode, float32, CPU) and ``task``'s dictionaries
    into the new folder ``folder``."""
    from torch.export import Dim

    reason = refusal(model)
    if reason:
        raise ExportError(reason)
    folder = Path(folder)
    folder.mkdir(parents=True)
    model = copy.deepcopy(model).eval()
    encoder, decoder = model.encoder, model.decoder
    with_table_positions(encoder)
    with_table_positions(decoder)
    layers = len(decoder.layers)
    heads, head_dim = decoder.layers[0].self_attn.num_heads, decoder.layers[0].self_attn.head_dim
    max_source, max_target = model.max_positions()
    pad, eos = task.source_dictionary.pad(), task.source_dictionary.eos()

    # sizes the inputs may take (the runner decodes within the positions' limits): torch.export
    # checks the programs hold for any, and fails where one would specialize
    batch = n = source = past = Dim.DYNAMIC
    src = torch.full((3, 7), pad, dtype=torch.long)
    src[:, -5:] = torch.randint(4, len(task.source_dictionary), (3, 5))
    src[0] = torch.randint(4, len(task.source_dictionary), (7,))  # one sentence without padding
    src[:, -1] = eos
    programs = {}
    with torch.no_grad():
        programs["encoder"] = torch.export.export(EncoderProgram(encoder), (src,),
                                                  dynamic_shapes=({0: batch, 1: source},), strict=False)
        encoder_out, mask = EncoderProgram(encoder)(src)
        rows = torch.arange(3).repeat_interleave(2)  # 2 hypotheses per sentence
        enc6, mask6 = encoder_out[:, rows], mask[rows]
        first_tokens = torch.full((6, 1), eos, dtype=torch.long)
        programs["first_step"] = torch.export.export(
            FirstStep(decoder), (first_tokens, enc6, mask6),
            dynamic_shapes=({0: n}, {0: source, 1: n}, {0: n, 1: source}), strict=False)
        _, self_k, self_v, cross_k, cross_v = FirstStep(decoder)(first_tokens, enc6, mask6)
        tokens = torch.randint(4, len(task.target_dictionary), (6, 1))
        _, self_k, self_v = NextStep(decoder)(tokens, self_k, self_v, cross_k, cross_v, mask6)  # 2 steps cached
        cache = {0: Dim.STATIC, 1: n, 2: Dim.STATIC, 3: past, 4: Dim.STATIC}
        programs["next_step"] = torch.export.export(
            NextStep(decoder), (tokens, self_k, self_v, cross_k, cross_v, mask6),
            dynamic_shapes=({0: n}, cache, cache, {1: n, 3: source}, {1: n, 3: source},
                            {0: n, 1: source}), strict=False)
    for name, program in programs.items():
        torch.export.save(program, str(folder / f"{name}.pt2"))
        log(f"exported {name}.pt2")
    task.source_dictionary.save(str(folder / "dict.src.txt"))
    task.target_dictionary.save(str(folder / "dict.tgt.txt"))
    d = task.target_dictionary
    config = {"format": runner.FORMAT, "bos": d.bos(), "pad": d.pad(), "eos": d.eos(), "unk": d.unk(),
              "max_source_positions": int(max_source), "max_target_positions": int(max_target),
              "layers": layers, "heads": heads, "head_dim": head_dim,
              "kinds": {side: getattr(getattr(model, side), "connection_spec", None) and
                        getattr(model, side).connection_spec.kind for side in ("encoder", "decoder")},
              "torch": torch.__version__}
    shutil.copyfile(runner.__file__, folder / "runner.py")
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")  # written last
    return folder
