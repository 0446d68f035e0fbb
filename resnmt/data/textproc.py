"""Text processing for resnmt.data.process: reading corpora, WMT SGML, Moses
tokenization (sacremoses), subword models (subword-nmt, sentencepiece) and cleaning.

Every output goes through resnmt.atomic, so an interrupted step never
leaves a half-written file that a later step would trust. Lines are split on "\\n"
only (a stray carriage return inside a line does not desynchronize a parallel corpus).
"""
import codecs
import collections
import concurrent.futures
import contextlib
import gzip
import itertools
import multiprocessing
import os
import re
import signal
import zlib

from tqdm import tqdm

from resnmt.atomic import atomic_open

CHUNK_LINES = 2000
# sentencepiece's refusal of a vocabulary larger than the corpus holds, and the most it would take
_SPM_LIMIT_RE = re.compile(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)")


class DataPrepError(Exception):
    """An error with a message for the user (no traceback)."""


# --------------------------------------------------------------------------- I/O

def open_text(path, errors="strict"):
    """Plain or gzipped UTF-8 text for reading, lines split on \\n only."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        return opener(path, "rt", encoding="utf-8", errors=errors, newline="\n")
    except OSError as e:
        raise DataPrepError(f"cannot read {path}: {e.strerror}") from None


def read_lines(paths, max_lines=0, errors="strict"):
    """Lines (without the newline) of the files in order; at most max_lines of each (0: all)."""
    for path in paths:
        with open_text(path, errors=errors) as f:
            try:
                for line in itertools.islice(f, max_lines or None):
                    yield line[:-1] if line.endswith("\n") else line
            except UnicodeDecodeError:
                raise DataPrepError(utf8_error(path) or f"{user_path(path)} is not valid UTF-8") from None
            except (OSError, EOFError) as e:  # truncated / corrupt gzip
                raise DataPrepError(f"cannot read {path}: {e}") from None


def blocks(path):
    """The bytes of a plain or gzipped (decompressed) file, in blocks."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            yield from iter(lambda: f.read(1 << 20), b"")
    except (OSError, EOFError, zlib.error) as e:  # also a truncated / corrupt gzip
        raise DataPrepError(f"cannot read {path} (corrupt or truncated?): {e}") from None


def user_path(path):
    """The file a path names for the user: the target of OUTDIR/orig's link to their own file."""
    return os.path.realpath(path)


def _utf8_scan(path):
    """(lines, None) for a UTF-8 file; (line, (byte offset, reason)) at its first invalid byte."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    fed, newlines, last = 0, 0, b"\n"
    for block in itertools.chain(blocks(path), [b""]):
        pending = len(decoder.getstate()[0])  # the bytes of a character cut by the last block
        try:
            decoder.decode(block, final=not block)
        except UnicodeDecodeError as e:
            return newlines + e.object[:e.start].count(b"\n") + 1, (fed - pending + e.start, e.reason)
        fed, newlines, last = fed + len(block), newlines + block.count(b"\n"), block[-1:] or last
    return newlines + (last != b"\n"), None


def utf8_error(path):
    """Where a plain or gzipped file stops being UTF-8, as one line naming the user's file, the
    line and the byte offset; None when it is valid UTF-8."""
    line, bad = _utf8_scan(path)
    if bad is None:
        return None
    where = "of the decompressed text" if str(path).endswith(".gz") else "of the file"
    return f"{user_path(path)}, line {line}: not valid UTF-8 at byte {bad[0]} {where} ({bad[1]})"


def checked_line_count(path) -> int:
    """Lines of a plain or gzipped file, which must be UTF-8 (else one line saying where it is not)."""
    line, bad = _utf8_scan(path)
    if bad is not None:
        raise DataPrepError(utf8_error(path))
    return line


def count_lines(path) -> int:
    """Lines of a plain or gzipped file (a last line without a newline counts)."""
    n, last = 0, b"\n"
    for block in blocks(path):
        n += block.count(b"\n")
        last = block[-1:]
    return n + (last != b"\n")


def copy_bytes(sources, dest) -> None:
    """The files (gzipped ones decompressed) concatenated byte for byte into dest."""
    with atomic_open(dest, "wb") as out:
        for src in sources:
            for block in blocks(src):
                out.write(block)


def same_line_count(*paths) -> int:
    """The common line count of parallel files; an error naming them if they differ."""
    counts = [count_lines(p) for p in paths]
    for path, n in zip(paths[1:], counts[1:]):
        if n != counts[0]:
            raise DataPrepError(f"parallel files differ in length: {paths[0]} has {counts[0]} lines, {path} has {n}")
    return counts[0]


def write_lines(path, lines) -> int:
    """Write the lines (without newlines) to path atomically; returns their number."""
    n = 0
    with atomic_open(path) as f:
        for line in lines:
            f.write(line + "\n")
            n += 1
    return n


def normalize_space(line: str) -> str:
    """One ASCII space between tokens, none at the ends: what subword-nmt, sentencepiece
    encoding and fairseq's tokenizer split on."""
    return " ".join(line.split())


def progress(desc: str, total=None) -> tqdm:
    """A tqdm bar on stderr, refreshed at most every 10 s (logs stay short)."""
    return tqdm(desc=desc, total=total, unit=" lines", unit_scale=True, mininterval=10, leave=True)


# ------------------------------------------------------------------------ SGML

SEG_RE = re.compile(r"<seg.*?>(.*)</seg>.*?")


def sgm_segments(path) -> list:
    """The segments of a WMT "fake SGML" file, one per line, by sacreBLEU's own rule
    (sacrebleu.dataset.fake_sgml.FakeSGMLDataset._convert_format: lines starting with
    "<seg ", the text between the tags, whitespace collapsed, entities left escaped), so
    the result equals `sacrebleu -t wmt14/full --echo src/ref`. sacreBLEU exposes this
    only as a private method writing into its download cache, hence these lines."""
    segments = [" ".join(SEG_RE.sub(r"\1", line).split())
                for line in read_lines([path]) if line.startswith("<seg ")]
    if not segments:
        raise DataPrepError(f"{path}: no <seg> lines found (not a WMT .sgm file?)")
    return segments


# ------------------------------------------------- Moses normalization and tokenization

_moses_line = None  # the per-process tokenizer of the worker pool


def _init_moses(lang: str):
    global _moses_line
    import regex
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    control = regex.compile(r"\p{C}")
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)

    def process(line):
        # normalize-punctuation.perl | remove-non-printing-char.perl | tokenizer.perl -a
        line = control.sub(" ", normalizer.normalize(line))
        line = tokenizer.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)
        return normalize_space(line)

    _moses_line = process


def _moses_chunk(chunk):
    return [_moses_line(line) for line in chunk]


def moses_tokenize(inputs, output, lang: str, workers: int, max_lines: int = 0) -> int:
    """Moses punctuation normalization, non-printing character removal and tokenization
    (aggressive hyphen splitting, escaping) of the inputs, concatenated, into output.
    sacremoses has no parallel API: chunks of lines go to `workers` processes, in order,
    at most 4 chunks per worker in flight (bounded memory on the 36M-line corpora).
    Invalid UTF-8 bytes (Common Crawl has some) become U+FFFD."""
    lines = read_lines(inputs, max_lines=max_lines, errors="replace")
    chunks = iter(lambda: list(itertools.islice(lines, CHUNK_LINES)), [])
    # the pool forks before any output exists (a signal during a fork can be lost: see pipeline.run)
    with _worker_pool(workers, _init_moses, (lang,)) as pool, atomic_open(output) as out, \
            progress(f"tokenize {os.path.basename(output)}") as bar:
        for done in _ordered_map(pool, _moses_chunk, chunks, workers):
            out.write("".join(line + "\n" for line in done))
            bar.update(len(done))
        return bar.n


def _init_worker(initializer, initargs):
    # a worker just dies of SIGTERM or Ctrl-C; the parent reports where the run stopped
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    initializer(*initargs)


@contextlib.contextmanager
def _worker_pool(workers, initializer, initargs):
    """A pool of `workers` processes set up by initializer(*initargs); for one worker,
    no pool (None) and the initializer runs here.

    concurrent.futures, not multiprocessing.Pool: a Pool whose worker is killed while it
    holds the task queue's lock (an idle worker always does) hangs for ever in terminate(),
    which is what leaving the `with` after SIGTERM to the process group calls. The executor
    watches each worker's exit instead and gives up the ones that died."""
    if workers <= 1:
        initializer(*initargs)
        yield None
        return
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                                  initializer=_init_worker, initargs=(initializer, initargs))
    try:
        pool.submit(int).result()  # forks every worker now, before the caller opens its output
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)  # the chunks being tokenized finish, no more start
        raise
    pool.shutdown(wait=True)


def _ordered_map(pool, fn, chunks, workers):
    """fn(chunk) for every chunk, in order, at most 4 chunks per worker in flight."""
    if pool is None:
        yield from map(fn, chunks)
        return
    pending = collections.deque()
    try:
        for chunk in chunks:
            pending.append(pool.submit(fn, chunk))
            if len(pending) >= 4 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except concurrent.futures.process.BrokenProcessPool:
        raise DataPrepError("a worker process died (killed, or out of memory): re-run to resume") from None


# --------------------------------------------------------------------- subwords

def learn_subword(method: str, inputs, model, size: int, spm_type: str, workers: int,
                  spm_sample: int = 10_000_000) -> str:
    """A joint subword model learned on the inputs (whitespace-normalized text):
    subword-nmt BPE codes (`size` merges) or a sentencepiece model (`size` pieces).
    Returns a line for the log."""
    if method == "subword-nmt":
        from subword_nmt.learn_bpe import get_vocabulary, learn_bpe

        vocab = collections.Counter()
        for path in inputs:  # subword-nmt counts words on its own workers
            with open(path, encoding="utf-8") as f:
                vocab += get_vocabulary(f, num_workers=workers)
        if not vocab:
            raise DataPrepError(f"no words in {', '.join(map(str, inputs))}")
        with atomic_open(model) as out:
            learn_bpe((f"{w} {c}" for w, c in vocab.items()), out, size, min_frequency=2, is_dict=True)
        merges = subword_model_size(method, model)
        note = f" (only {merges:,} merges have frequency >= 2)" if merges < size else ""
        return f"{merges:,} merges from {len(vocab):,} word types{note}"

    import sentencepiece as spm

    def train(vocab_size: int) -> None:
        with atomic_open(model, "wb") as out:
            spm.SentencePieceTrainer.train(
                sentence_iterator=read_lines(inputs),
                model_writer=out,
                vocab_size=vocab_size,
                model_type=spm_type,
                character_coverage=1.0,
                # identity: no NFKC, so decoding gives back the original characters
                # (the references are never normalized either)
                normalization_rule_name="identity",
                input_sentence_size=spm_sample,
                shuffle_input_sentence=True,
                num_threads=workers,
                minloglevel=1,
            )

    note = ""
    try:
        try:
            train(size)
        except RuntimeError as e:
            # a small corpus holds fewer pieces than asked for: sentencepiece names the most it
            # can learn ("Vocabulary size too high (8000). Please set it to a value <= 6156.")
            limit = _SPM_LIMIT_RE.search(str(e))
            if limit is None or int(limit.group(1)) >= size:
                raise
            note = (f" (--bpe-size {size} is more than this corpus holds: capped at {int(limit.group(1)):,}, "
                    "the most sentencepiece can learn from it)")
            size = int(limit.group(1))
            train(size)
    except RuntimeError as e:
        # "Vocabulary size is smaller than required_chars. 10 vs 82. Increase vocab_size ...":
        # named in resnmt-prepare's terms
        chars = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(e))
        hint = f" (use --bpe-size {chars.group(1)} or more: every character needs a piece)" if chars else ""
        raise DataPrepError(f"sentencepiece training failed: {str(e).strip()}{hint}") from None
    return f"sentencepiece {spm_type} model, {size:,} pieces{note}"


def subword_model_size(method: str, model) -> int:
    """The size of a learned subword model: sentencepiece pieces, or subword-nmt merges."""
    if method == "subword-nmt":
        with open(model, encoding="utf-8") as f:
            return sum(1 for line in f if not line.startswith("#version"))
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()


def apply_subword(method: str, model, pairs, workers: int) -> None:
    """Segment each (input, output) pair of files with the model, on the libraries' own
    workers (subword-nmt's process pool, sentencepiece's threads)."""
    if method == "subword-nmt":
        from subword_nmt.apply_bpe import BPE

        with open(model, encoding="utf-8") as f:
            bpe = BPE(f)
        for inp, outp in pairs:
            with atomic_open(outp) as out:
                bpe.process_lines(str(inp), out, num_workers=workers)
            # subword-nmt's workers do not report failures: check that every line came back
            same_line_count(inp, outp)
        return

    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    for inp, outp in pairs:
        lines = read_lines([inp])
        with atomic_open(outp) as out:
            for chunk in iter(lambda: list(itertools.islice(lines, 20 * CHUNK_LINES)), []):
                pieces = sp.encode(chunk, out_type=str, num_threads=workers)
                out.write("".join(" ".join(p) + "\n" for p in pieces))


# ------------------------------------------------------------------------ clean

def clean_pairs(src_in, tgt_in, src_out, tgt_out, max_len: int, ratio: float) -> str:
    """Keep a pair when both sides have 1..max_len tokens and neither is more than
    `ratio` times longer than the other (0: no ratio test), as Moses
    clean-corpus-n.perl. Returns a line for the log."""
    kept = dropped_len = dropped_ratio = 0
    pairs = itertools.zip_longest(read_lines([src_in]), read_lines([tgt_in]))
    with atomic_open(src_out) as fs, atomic_open(tgt_out) as ft:
        for s, t in pairs:
            if s is None or t is None:
                raise DataPrepError(f"{src_in} and {tgt_in} have different line counts "
                                    f"({src_in if s is None else tgt_in} ends first)")
            ns, nt = len(s.split()), len(t.split())
            if not (1 <= ns <= max_len and 1 <= nt <= max_len):
                dropped_len += 1
            elif ratio and (ns > ratio * nt or nt > ratio * ns):
                dropped_ratio += 1
            else:
                fs.write(normalize_space(s) + "\n")
                ft.write(normalize_space(t) + "\n")
                kept += 1
        if kept == 0:
            raise DataPrepError(f"cleaning {src_in}/{tgt_in} kept no pair")
    total = kept + dropped_len + dropped_ratio
    return (f"kept {kept:,} of {total:,} pairs (dropped {dropped_len:,} outside 1..{max_len} tokens"
            + (f", {dropped_ratio:,} with length ratio > {ratio:g}" if ratio else "") + ")")
