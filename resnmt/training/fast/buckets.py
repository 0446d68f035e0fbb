"""``--fast-path``'s static shapes: training batches of a small fixed set of shapes.

fairseq batches sentences of similar length and pads each batch to its longest sentence,
so almost every batch has a shape of its own (sentences x source length x target length):
a captured CUDA graph, a compiled kernel or cuDNN's attention plan made for one batch is
of no use for the next. :class:`BucketedPairDataset` wraps the training split's
``LanguagePairDataset`` so that every batch has one of at most ``K`` shapes
(``--shape-buckets K``):

* each sentence pair goes to a length bucket by ``max(source length, target length)``,
  fairseq's own size of a pair for ``--max-tokens``; the buckets' upper sizes (multiples
  of the task's ``--required-seq-len-multiple``) are the ones that make the fewest token
  slots, padding and dummy rows included (:func:`bucket_sizes`);
* every batch of bucket ``k`` pads its source to ``S_k`` and its target to ``T_k``, the
  longest source and target among the bucket's sentences, and holds ``B_k`` rows: the
  largest multiple of ``--required-batch-size-multiple`` (8 by default, which keeps the
  matrix products' row count a multiple of 8 for the tensor cores) with ``B_k *
  max(S_k, T_k) <= --max-tokens``, at most ``--batch-size``;
* a bucket's last batch, short of ``B_k`` sentences, is filled with dummy rows: source
  ``eos`` alone (the rest padding, so attention never meets a row with nothing to attend
  to), previous output tokens ``eos`` alone, target all padding. The criteria ignore
  padding targets, so the loss, nll_loss, ntokens and gradients are those of the real
  sentences (``nsentences`` counts them too). The one difference: a kind whose
  activation keeps batch statistics (``--normalized-activation-stats batch``) counts
  the dummy rows' ``eos`` tokens among a batch's tokens.

Which sentences share a batch follows fairseq: the sentences in fairseq's order
(``ordered_indices`` under the seed: by length, ties at random), filtered by
``--max-positions``, cut into batches bucket by bucket. Everything else is fairseq's:
the batches are built once (resnmt_translation builds them as at epoch 1 whatever the
starting epoch, so resuming is exact), shuffled every epoch by fairseq's
``EpochBatchIterator`` and sharded over data-parallel ranks by it.

The padding this costs is measured when the batches are built and logged once (``[fast
path] shape buckets: ...``): the fraction of the batches' token slots (source and target)
that hold padding, beside the fraction fairseq's own batches of the same sentences would
hold; :attr:`BucketedPairDataset.padding` keeps the numbers.
"""
import logging
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset

logger = logging.getLogger(__name__)


def bucket_sizes(sizes: Sequence[int], num_buckets: int, multiple: int = 1,
                 rows_of: Optional[Callable[[int], int]] = None) -> np.ndarray:
    """The buckets' upper sizes, ascending: the at most ``num_buckets`` sizes (multiples
    of ``multiple``; the last the largest size) that make the fewest token slots when every
    size is padded up to the first of them that holds it, and, given ``rows_of(size)``
    (the rows of a batch of that size), every bucket's sentences fill whole batches of
    that many rows (a short last batch filled with dummy rows). Found exactly by dynamic
    programming over the distinct sizes (O(buckets x distinct sizes^2): milliseconds for
    a corpus). fairseq's ``--num-batch-buckets`` takes quantiles instead, which put the long
    tail into one bucket padded to the longest sentence: on Multi30k at 4096 tokens 8
    quantile buckets make 26 % of the token slots padding, these 15 %."""
    if num_buckets < 1:
        raise ValueError(f"--shape-buckets {num_buckets}: give at least 1")
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.size == 0:
        raise ValueError("--fast-path: no training sentences to batch")
    values, counts = np.unique(-(-sizes // multiple) * multiple, return_counts=True)
    n = len(values)
    if n <= num_buckets:
        return values
    total_count = np.concatenate([[0], np.cumsum(counts)])

    def slots(first, last: int):
        """Token slots of a bucket of values[first..last] (``first``: one index or many)."""
        sentences = total_count[last + 1] - total_count[first]
        if rows_of is None:
            return sentences * values[last]
        rows = rows_of(int(values[last]))
        return -(-sentences // rows) * rows * values[last]

    # least[k][j]: the fewest slots of values[0..j] in exactly k + 1 buckets; first[k][j]:
    # where its last bucket starts (with more distinct sizes than buckets, using every
    # bucket is never worse)
    least = np.full((num_buckets, n), np.inf)
    first = np.zeros((num_buckets, n), dtype=np.int64)
    least[0] = [slots(0, j) for j in range(n)]
    for k in range(1, num_buckets):
        for j in range(k, n):
            starts = np.arange(k, j + 1)
            cost = least[k - 1][starts - 1] + slots(starts, j)
            i = int(np.argmin(cost))
            least[k][j], first[k][j] = cost[i], starts[i]
    k = int(np.argmin(least[:, n - 1]))  # fewer buckets may fill their batches better
    edges, j = [], n - 1
    for k in range(k, -1, -1):
        edges.append(values[j])
        j = first[k][j] - 1
    return np.array(edges[::-1], dtype=np.int64)


def bucket_batch_size(length: int, max_tokens: Optional[int], max_sentences: Optional[int],
                      multiple: int = 1) -> int:
    """Rows per batch of a bucket of ``length``: the most with ``rows * length <=
    max_tokens`` and ``rows <= max_sentences``, rounded down to ``multiple`` where at
    least ``multiple`` fit (fairseq's ``batch_by_size`` keeps smaller batches whole too)."""
    rows = max_tokens // length if max_tokens else None
    if max_sentences:
        rows = max_sentences if rows is None else min(rows, max_sentences)
    if rows is None:
        raise ValueError("--fast-path: give --max-tokens or --batch-size to size the batches")
    if rows < 1:
        raise ValueError(f"--max-tokens {max_tokens}: a shape bucket pads sentences to {length} tokens, more "
                         f"than a batch holds; raise --max-tokens to at least {length}")
    if multiple > 1 and rows >= multiple:
        rows -= rows % multiple
    return int(rows)


def padding_fraction(batches: Sequence[np.ndarray], src_sizes, tgt_sizes, shape_of) -> float:
    """The fraction of the token slots (source and target) of ``batches`` that hold
    padding, each batch of ``shape_of(batch) = (rows, source length, target length)``."""
    slots = real = 0
    for batch in batches:
        rows, src_len, tgt_len = shape_of(batch)
        slots += rows * (src_len + tgt_len)
        real += int(src_sizes[batch].sum()) + int(tgt_sizes[batch].sum())
    return 1.0 - real / slots if slots else 0.0


class BucketedPairDataset(BaseWrapperDataset):
    """A ``LanguagePairDataset`` (with targets) whose batches come in at most
    ``num_buckets`` static shapes (module docstring). Items, sizes and filtering are the
    wrapped dataset's; :meth:`batch_by_size` builds the shapes and the batches,
    :meth:`collater` pads and fills each batch to its bucket's shape."""

    def __init__(self, dataset, num_buckets: int):
        super().__init__(dataset)
        if getattr(dataset, "tgt_sizes", None) is None:
            raise ValueError("--fast-path: the training split has no targets")
        self.num_buckets = num_buckets
        self.multiple = max(int(getattr(dataset, "pad_to_multiple", 1) or 1), 1)
        self.sizes_vec = np.maximum(dataset.src_sizes, dataset.tgt_sizes)
        self.pad, self.eos = dataset.src_dict.pad(), dataset.src_dict.eos()
        # per bucket, set by batch_by_size: upper size, rows, source and target lengths
        self.edges = self.rows = self.src_lengths = self.tgt_lengths = None
        self.padding: Optional[dict] = None

    def bucket_of(self, sizes):
        """The bucket of each size (the first whose upper size holds it)."""
        return np.searchsorted(self.edges, sizes, side="left")

    def shapes(self) -> List[tuple]:
        """``(rows, source length, target length)`` of each bucket's batches."""
        if self.edges is None:
            raise RuntimeError("the shape buckets are made with the batches (batch_by_size)")
        return [(int(b), int(s), int(t)) for b, s, t in zip(self.rows, self.src_lengths, self.tgt_lengths)]

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        """``indices`` (fairseq's order, filtered) cut into batches bucket by bucket, each
        of at most its bucket's rows; makes the shapes and logs the padding, once."""
        indices = np.asarray(indices, dtype=np.int64)
        src, tgt = self.dataset.src_sizes, self.dataset.tgt_sizes
        self.edges = bucket_sizes(self.sizes_vec[indices], self.num_buckets, self.multiple, rows_of=lambda size:
                                  bucket_batch_size(size, max_tokens, max_sentences, required_batch_size_multiple))
        buckets = self.bucket_of(self.sizes_vec[indices])
        members = [indices[buckets == k] for k in range(len(self.edges))]
        keep = [k for k, m in enumerate(members) if len(m)]  # rounding can leave a bucket empty
        self.edges, members = self.edges[keep], [members[k] for k in keep]

        def longest(sizes, m):
            return int(-(-int(sizes[m].max()) // self.multiple) * self.multiple)

        self.src_lengths = np.array([longest(src, m) for m in members], dtype=np.int64)
        self.tgt_lengths = np.array([longest(tgt, m) for m in members], dtype=np.int64)
        self.rows = np.array([bucket_batch_size(max(s, t), max_tokens, max_sentences, required_batch_size_multiple)
                              for s, t in zip(self.src_lengths, self.tgt_lengths)], dtype=np.int64)
        batches = [m[i:i + rows] for m, rows in zip(members, self.rows) for i in range(0, len(m), rows)]
        self._measure_padding(indices, batches, max_tokens, max_sentences, required_batch_size_multiple)
        return batches

    def _shape_of(self, batch):
        k = int(self.bucket_of(self.sizes_vec[batch].max()))
        return int(self.rows[k]), int(self.src_lengths[k]), int(self.tgt_lengths[k])

    def _measure_padding(self, indices, batches, max_tokens, max_sentences, required_batch_size_multiple):
        src, tgt = self.dataset.src_sizes, self.dataset.tgt_sizes
        fairseq_batches = self.dataset.batch_by_size(indices, max_tokens=max_tokens, max_sentences=max_sentences,
                                                     required_batch_size_multiple=required_batch_size_multiple)
        per_bucket = np.bincount([int(self.bucket_of(self.sizes_vec[b].max())) for b in batches],
                                 minlength=len(self.edges))
        self.padding = {
            "shapes": [{"rows": b, "source": s, "target": t, "batches": int(n)}
                       for (b, s, t), n in zip(self.shapes(), per_bucket)],
            "sentences": int(len(indices)),
            "batches": len(batches),
            "dummy_rows": int(sum(self._shape_of(b)[0] - len(b) for b in batches)),
            "padding_fraction": padding_fraction(batches, src, tgt, self._shape_of),
            "fairseq_batches": len(fairseq_batches),
            "fairseq_padding_fraction": padding_fraction(
                fairseq_batches, src, tgt, lambda b: (len(b), int(src[b].max()), int(tgt[b].max()))),
        }
        p = self.padding
        logger.info(
            "[fast path] shape buckets: %d shapes (rows x source x target: %s) for %d sentences in %d batches "
            "(%d dummy rows); padding: %.1f %% of the token slots (fairseq's own %d batches: %.1f %%)",
            len(p["shapes"]), ", ".join(f"{s['rows']}x{s['source']}x{s['target']}" for s in p["shapes"]),
            p["sentences"], p["batches"], p["dummy_rows"], 100 * p["padding_fraction"], p["fairseq_batches"],
            100 * p["fairseq_padding_fraction"])

    def collater(self, samples):
        """The wrapped dataset's batch with source and target padded to the bucket's
        lengths and dummy rows after the real ones up to the bucket's rows."""
        if len(samples) == 0:
            return {}
        if self.edges is None:
            raise RuntimeError("the shape buckets are made with the batches (batch_by_size)")
        longest = max(max(len(s["source"]), len(s["target"])) for s in samples)
        k = int(self.bucket_of(longest))
        batch = self.dataset.collater(
            samples, pad_to_length={"source": int(self.src_lengths[k]), "target": int(self.tgt_lengths[k])})
        return self.fill(batch, int(self.rows[k]) - len(samples))

    def synthetic_batch(self, k: int) -> dict:
        """A batch of bucket ``k``'s shape made of words, no padding (built by the wrapped
        dataset's collater as the real ones are, so it has their keys in their order): the
        fast path warms up and records each bucket's step on one before training."""
        rows, src_len, tgt_len = self.shapes()[k]
        words = len(self.dataset.src_dict) - self.dataset.src_dict.nspecial

        def sentence(i: int, length: int) -> torch.Tensor:
            tokens = self.dataset.src_dict.nspecial + (torch.arange(length) + i) % words
            tokens[-1] = self.eos
            return tokens

        samples = [{"id": i, "source": sentence(i, src_len), "target": sentence(i, tgt_len)} for i in range(rows)]
        return self.dataset.collater(samples, pad_to_length={"source": src_len, "target": tgt_len})

    def fill(self, batch: dict, dummies: int) -> dict:
        """``batch`` with ``dummies`` rows appended that the loss ignores (module docstring)."""
        if dummies <= 0:
            return batch
        net_input = batch["net_input"]

        def one_eos(like: torch.Tensor, left_pad: bool) -> torch.Tensor:
            rows = like.new_full((dummies, like.size(1)), self.pad)
            rows[:, -1 if left_pad else 0] = self.eos
            return torch.cat([like, rows])

        net_input["src_tokens"] = one_eos(net_input["src_tokens"], self.dataset.left_pad_source)
        net_input["src_lengths"] = torch.cat([net_input["src_lengths"], net_input["src_lengths"].new_ones(dummies)])
        if "prev_output_tokens" in net_input:
            net_input["prev_output_tokens"] = one_eos(net_input["prev_output_tokens"], self.dataset.left_pad_target)
        target = batch["target"]
        batch["target"] = torch.cat([target, target.new_full((dummies, target.size(1)), self.pad)])
        batch["id"] = torch.cat([batch["id"], batch["id"].new_full((dummies,), -1)])
        return batch
