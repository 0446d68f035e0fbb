"""Translate with a ``resnmt-export --format torch-export`` artifact: torch only, no resnmt, no fairseq.

This file is copied into every artifact as ``runner.py``::

    python runner.py ARTIFACT < source.txt > hypotheses.txt     # one segmented sentence per line

    import sys; sys.path.insert(0, ARTIFACT)
    import runner
    translator = runner.Translator(ARTIFACT)
    translator.translate([["a", "man", "is", "riding", "a", "bike", "."]], beam=4)

The input is what the model was trained on (subword pieces separated by spaces; the
dictionaries are the artifact's), and so is the output. The search is fairseq-generate's
beam search (``fairseq.sequence_generator.SequenceGenerator`` with ``BeamSearch``): 2 x beam
candidates per sentence, an end-of-sentence candidate finished only among the first
``beam``, a sentence done when ``beam`` hypotheses have ended, then dropped from the batch;
the length limit ``min(max_len_a * S + max_len_b, max positions - 1)`` (S the batch's
padded source length); scores normalized by ``length ** lenpen`` (``normalize=False``:
not); ``unkpen`` subtracted from the unknown word's log-probability. :class:`ProgramStepper`
offers the step interface of resnmt's fast beam search (``encode``, ``step``), which decodes
with it as well.
"""
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch
from torch import Tensor

FORMAT = "resnmt-torch-export-1"


def read_dictionary(path) -> List[str]:
    """A fairseq dictionary file's symbols, fairseq's four specials first."""
    symbols = ["<s>", "<pad>", "</s>", "<unk>"]
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        word = line.rsplit(" ", 1)[0]
        if line.endswith(" #fairseq:overwrite"):
            word = line[: -len(" #fairseq:overwrite")].rsplit(" ", 1)[0]
        symbols.append(word)
    return symbols


class ProgramStepper:
    """The artifact's programs one step at a time: ``encode(src_tokens, src_lengths, max_len)``
    and ``step(tokens, state, order, beam)`` -> log-probabilities (N, V), ``order`` the row of the
    previous step each hypothesis continues (None at the first step)."""

    def __init__(self, folder):
        folder = Path(folder)
        self.config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        if self.config.get("format") != FORMAT:
            raise ValueError(f"{folder}: not a resnmt torch-export artifact of format {FORMAT}")
        self.programs = {name: torch.export.load(str(folder / f"{name}.pt2")).module()
                         for name in ("encoder", "first_step", "next_step")}
        self.max_positions = self.config["max_target_positions"]

    def encode(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None, max_len: int = 0, beam: int = 1) -> dict:
        # the step repeats each sentence's encoder output for its beam at the first step (``beam`` unused)
        encoder_out, mask = self.programs["encoder"](src_tokens)
        return {"encoder_out": encoder_out, "mask": mask, "cache": None}

    def step(self, tokens: Tensor, state: dict, order: Optional[Tensor], beam: int, temperature: float = 1.0) -> Tensor:
        if state["cache"] is None:  # the first step: each sentence's encoder output for its beam
            rows = torch.arange(state["mask"].size(0)).repeat_interleave(tokens.size(0) // state["mask"].size(0))
            log_probs, self_k, self_v, cross_k, cross_v = self.programs["first_step"](
                tokens.view(-1, 1), state["encoder_out"][:, rows], state["mask"][rows])
            state.update(cache=(self_k, self_v, cross_k, cross_v), mask=state["mask"][rows])
        else:
            self_k, self_v, cross_k, cross_v = state["cache"]
            mask = state["mask"]
            if order is not None:
                self_k, self_v = self_k[:, order], self_v[:, order]
                cross_k, cross_v, mask = cross_k[:, order], cross_v[:, order], mask[order]
            log_probs, self_k, self_v = self.programs["next_step"](tokens.view(-1, 1), self_k, self_v, cross_k,
                                                                   cross_v, mask)
            state.update(cache=(self_k, self_v, cross_k, cross_v), mask=mask)
        if temperature != 1.0:
            log_probs = torch.log_softmax(log_probs / temperature, dim=-1)
        return log_probs


def beam_search(stepper, src_tokens: Tensor, beam: int, pad: int, eos: int, unk: int, max_len_a: float = 0.0,
                max_len_b: int = 200, lenpen: float = 1.0, normalize: bool = True, unkpen: float = 0.0,
                min_len: int = 1) -> List[List[Dict]]:
    """fairseq's beam search on one batch (``src_tokens`` (B, S), left-padded, EOS last): per
    sentence its finished hypotheses, best first: ``tokens`` (ending with EOS), ``score``,
    ``positional_scores``."""
    bsz, src_len = src_tokens.shape
    max_len = min(int(max_len_a * src_len + max_len_b), stepper.max_positions - 1)
    state = stepper.encode(src_tokens, src_tokens.ne(pad).sum(dim=1), max_len)
    tokens = torch.full((bsz * beam, max_len + 2), pad, dtype=torch.long)
    tokens[:, 0] = eos
    scores = torch.zeros(bsz * beam, max_len + 1)
    ignored = torch.zeros(bsz, beam, dtype=torch.bool)
    cand_size, cand_offsets = 2 * beam, torch.arange(2 * beam)
    offsets = torch.arange(bsz).unsqueeze(1) * beam
    sentence = list(range(bsz))  # each row's sentence of the batch as given
    finished: List[List[Dict]] = [[] for _ in range(bsz)]
    order = None
    for step in range(max_len + 1):
        lprobs = stepper.step(tokens[:, step], state, order, beam)
        lprobs[lprobs != lprobs] = -math.inf
        lprobs[:, pad] = -math.inf
        lprobs[:, unk] -= unkpen
        if step >= max_len:
            lprobs[:, :eos] = -math.inf
            lprobs[:, eos + 1:] = -math.inf
        if step < min_len:
            lprobs[:, eos] = -math.inf
        vocab = lprobs.size(1)
        lp = lprobs.view(bsz, beam, vocab)
        lp = lp[:, :1] if step == 0 else lp + scores.view(bsz, beam, -1)[:, :, step - 1].unsqueeze(-1)
        flat = lp.reshape(bsz, -1)
        cand_scores, cand_flat = torch.topk(flat, k=min(cand_size, flat.size(1) - 1))
        cand_beams, cand_words = cand_flat // vocab, cand_flat % vocab
        cand_rows = cand_beams + offsets
        eos_mask = cand_words.eq(eos) & cand_scores.ne(-math.inf)
        eos_mask[:, :beam] &= ~ignored
        done_rows = []  # the rows of the batch whose sentence is done
        for b, k in eos_mask[:, :beam].nonzero().tolist():  # the hypotheses that end now, best first
            hyps = finished[sentence[b]]
            if len(hyps) < beam:
                row = int(cand_rows[b, k])
                pos = scores[row, : step + 1].clone()
                pos[step] = cand_scores[b, k]
                pos[1:] = pos[1:] - pos[:-1]
                score = float(cand_scores[b, k]) / ((step + 1) ** lenpen if normalize else 1.0)
                hyp_tokens = tokens[row, 1: step + 2].clone()
                hyp_tokens[step] = eos
                hyps.append({"tokens": hyp_tokens, "score": score, "positional_scores": pos})
            if (len(hyps) == beam or step == max_len) and b not in done_rows:
                done_rows.append(b)
        if len(done_rows) == bsz:
            break
        if step == max_len:
            raise RuntimeError("beam search: sentences left at the maximum length")
        keep = None
        if done_rows:
            keep = torch.tensor([b for b in range(bsz) if b not in done_rows])
            eos_mask, cand_beams, cand_scores, cand_words = eos_mask[keep], cand_beams[keep], cand_scores[keep], \
                cand_words[keep]
            ignored = ignored[keep]
            scores = scores.view(bsz, -1)[keep].view(keep.numel() * beam, -1)
            tokens = tokens.view(bsz, -1)[keep].view(keep.numel() * beam, -1)
            sentence = [sentence[b] for b in keep.tolist()]
            bsz = keep.numel()
            offsets = offsets[:bsz]
            cand_rows = cand_beams + offsets
        eos_mask[:, :beam] = ~((~ignored) & (~eos_mask[:, :beam]))
        active = eos_mask.long() * cand_size + cand_offsets[: eos_mask.size(1)]
        new_ignored, active_hypos = torch.topk(active, k=beam, dim=1, largest=False)
        ignored = new_ignored.ge(cand_size)[:, :beam]
        active_rows = torch.gather(cand_rows, 1, active_hypos).view(-1)
        tokens[:, : step + 1] = tokens[:, : step + 1].index_select(0, active_rows)
        tokens.view(bsz, beam, -1)[:, :, step + 1] = torch.gather(cand_words, 1, active_hypos)
        if step > 0:
            scores[:, :step] = scores[:, :step].index_select(0, active_rows)
        scores.view(bsz, beam, -1)[:, :, step] = torch.gather(cand_scores, 1, active_hypos)
        order = active_rows
        if keep is not None:  # rows of the previous step, before the done sentences were dropped
            shift = keep - torch.arange(keep.numel())
            order = (order.view(-1, beam) + shift.unsqueeze(-1) * beam).view(-1)
    return [sorted(hyps, key=lambda h: -h["score"]) for hyps in finished]


class Translator:
    """Segmented sentences in, the best hypothesis of each out (as lists of symbols)."""

    def __init__(self, folder):
        folder = Path(folder)
        self.stepper = ProgramStepper(folder)
        self.source = read_dictionary(folder / "dict.src.txt")
        self.target = read_dictionary(folder / "dict.tgt.txt")
        self.index = {w: i for i, w in reversed(list(enumerate(self.source)))}
        c = self.stepper.config
        self.pad, self.eos, self.unk = c["pad"], c["eos"], c["unk"]

    def encode(self, words: List[str]) -> List[int]:
        return [self.index.get(w, self.unk) for w in words] + [self.eos]

    def hypotheses(self, sentences: List[List[str]], beam: int = 4, batch_size: int = 32, **search) -> List[List[Dict]]:
        """Every finished hypothesis of each sentence (best first), in fairseq's length-sorted
        batches of ``batch_size`` (``search``: :func:`beam_search`'s options)."""
        ids = [self.encode(s) for s in sentences]
        order = sorted(range(len(ids)), key=lambda k: len(ids[k]))
        out: List[Optional[List[Dict]]] = [None] * len(ids)
        with torch.no_grad():
            for start in range(0, len(order), batch_size):
                chunk = order[start: start + batch_size]
                width = max(len(ids[k]) for k in chunk)
                src = torch.full((len(chunk), width), self.pad, dtype=torch.long)
                for row, k in enumerate(chunk):
                    src[row, width - len(ids[k]):] = torch.tensor(ids[k])
                for k, hyps in zip(chunk, beam_search(self.stepper, src, beam, self.pad, self.eos, self.unk,
                                                      **search)):
                    out[k] = hyps
        return out

    def translate(self, sentences: List[List[str]], beam: int = 4, batch_size: int = 32, **search) -> List[List[str]]:
        return [[self.target[i] for i in hyps[0]["tokens"][:-1].tolist()]
                for hyps in self.hypotheses(sentences, beam, batch_size, **search)]


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python runner.py ARTIFACT < segmented-source.txt > hypotheses.txt", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    translator = Translator(args[0])
    lines = [line.split() for line in sys.stdin.read().splitlines()]
    for words in translator.translate(lines):
        print(" ".join(words))
    return 0


if __name__ == "__main__":
    sys.exit(main())
