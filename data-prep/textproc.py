#!/usr/bin/env python3
"""Text processing steps for the data-prep/prepare-*.sh scripts.

Each subcommand reads plain or gzipped UTF-8 text and writes its output
atomically (a temporary name in the same directory, renamed when complete), so
an interrupted run never leaves a half-written file that a later step would
trust. Long jobs run on --workers processes in order-preserving chunks and
report progress on stderr, prefixed with $DATAPREP_TAG.

  sgm2txt         WMT "fake SGML" -> one segment per line (same rule as sacreBLEU)
  moses           Moses punctuation normalization, non-printing character removal
                  and tokenization (sacremoses; aggressive hyphen splitting)
  subword-learn   joint subword model: subword-nmt BPE codes or a sentencepiece model
  subword-apply   apply the subword model to files (IN OUT pairs)
  spm-decode      sentencepiece pieces -> text (used by tests and evaluation)
  clean           parallel length / ratio filter, like Moses clean-corpus-n.perl

Lines are split on "\\n" only (a stray carriage return inside a line does not
desynchronize a parallel corpus).
"""
import argparse
import codecs
import collections
import gzip
import itertools
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time

TAG = os.environ.get("DATAPREP_TAG", "textproc")
CHUNK_LINES = 2000


class DataPrepError(Exception):
    """An error with a message for the user (no traceback)."""


def log(msg):
    print(f"[{TAG}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- I/O

_bad_bytes = collections.Counter()


def _count_and_replace(err):
    _bad_bytes["n"] += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("dataprep_replace", _count_and_replace)


def open_text(path, errors="strict"):
    """Open plain or gzipped UTF-8 text for reading, splitting lines on \\n only."""
    try:
        if str(path).endswith(".gz"):
            return gzip.open(path, "rt", encoding="utf-8", errors=errors, newline="\n")
        return open(path, "r", encoding="utf-8", errors=errors, newline="\n")
    except OSError as e:
        raise DataPrepError(f"cannot read {path}: {e.strerror}") from None


_UMASK = os.umask(0)
os.umask(_UMASK)


class AtomicWriter:
    """Write to a temporary file next to `path`; rename onto `path` only on success."""

    def __init__(self, path):
        self.path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        fd, self.tmp = tempfile.mkstemp(prefix=os.path.basename(self.path) + ".", suffix=".tmp", dir=directory)
        os.chmod(self.tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual permissions
        self.f = os.fdopen(fd, "w", encoding="utf-8", newline="\n")

    def __enter__(self):
        return self.f

    def __exit__(self, exc_type, exc, tb):
        self.f.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            os.unlink(self.tmp)
        return False


def read_lines(paths, max_lines=0, errors="strict"):
    """Lines (without the trailing newline) of the files in order; at most max_lines per file."""
    for path in paths:
        with open_text(path, errors=errors) as f:
            it = f if not max_lines else itertools.islice(f, max_lines)
            try:
                for line in it:
                    yield line[:-1] if line.endswith("\n") else line
            except UnicodeDecodeError as e:
                raise DataPrepError(f"{path} is not valid UTF-8 ({e.reason} at byte {e.start} of a chunk)") from None
            except (OSError, EOFError) as e:  # truncated / corrupt gzip
                raise DataPrepError(f"cannot read {path}: {e}") from None


def fast_line_count(paths, max_lines=0):
    """Lines in plain files, by counting newlines in binary (None if any is gzipped)."""
    total = 0
    for path in paths:
        if str(path).endswith(".gz"):
            return None
        n = 0
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                n += block.count(b"\n")
            if f.tell() and not _ends_with_newline(f):
                n += 1
        total += min(n, max_lines) if max_lines else n
    return total


def _ends_with_newline(f):
    f.seek(-1, os.SEEK_END)
    return f.read(1) == b"\n"


class Progress:
    """Periodic 'N lines (x%, rate, ETA)' lines on stderr."""

    def __init__(self, desc, total=None, every_s=10.0):
        self.desc, self.total, self.every_s = desc, total, every_s
        self.t0 = self.last = time.time()
        self.n = 0

    def add(self, n):
        self.n += n
        now = time.time()
        if now - self.last >= self.every_s:
            self.last = now
            rate = self.n / (now - self.t0)
            msg = f"{self.desc}: {self.n:,} lines"
            if self.total:
                eta = (self.total - self.n) / rate if rate else 0
                msg += f" of {self.total:,} ({100 * self.n / self.total:.0f}%, {rate:,.0f} lines/s, {eta / 60:.0f} min left)"
            else:
                msg += f" ({rate:,.0f} lines/s)"
            log(msg)

    def done(self):
        dt = max(time.time() - self.t0, 1e-9)
        log(f"{self.desc}: {self.n:,} lines in {dt:.1f}s ({self.n / dt:,.0f} lines/s)")


# ------------------------------------------------------- order-preserving parallel map

_worker_fn = None


def _init_worker(factory, args):
    global _worker_fn
    _worker_fn = factory(*args)


def _run_chunk(chunk):
    return [_worker_fn(line) for line in chunk]


def map_lines(lines, factory, factory_args, out, workers, desc, total=None):
    """Write factory(*factory_args)(line) for every line to `out`, in input order.

    At most 4 chunks per worker are in flight, so memory stays bounded on the
    36M-line corpora (multiprocessing.Pool.imap would read the whole input ahead).
    """
    progress = Progress(desc, total)
    chunks = iter(lambda: list(itertools.islice(lines, CHUNK_LINES)), [])
    if workers <= 1:
        fn = factory(*factory_args)
        for chunk in chunks:
            out.write("".join(fn(line) + "\n" for line in chunk))
            progress.add(len(chunk))
    else:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(factory, factory_args)) as pool:
            pending = collections.deque()
            for chunk in chunks:
                pending.append(pool.apply_async(_run_chunk, (chunk,)))
                while len(pending) >= 4 * workers or (pending and pending[0].ready()):
                    done = pending.popleft().get()
                    out.write("".join(line + "\n" for line in done))
                    progress.add(len(done))
            while pending:
                done = pending.popleft().get()
                out.write("".join(line + "\n" for line in done))
                progress.add(len(done))
    progress.done()
    return progress.n


# ------------------------------------------------------------------------ sgm2txt

SEG_RE = re.compile(r"<seg[^>]*>(.*)</seg>")


def cmd_sgm2txt(args):
    """Segments of a WMT .sgm file, one per line.

    Same rule as sacreBLEU's FakeSGMLDataset (so OUTDIR/raw/test.* equal
    `sacrebleu -t wmt14/full -l en-de --echo src/ref`): take the text between
    <seg ...> and </seg>, strip it and collapse runs of whitespace; no entity
    unescaping.
    """
    n = 0
    with AtomicWriter(args.output) as out:
        for line in read_lines([args.input]):
            if line.lstrip().startswith("<seg"):
                m = SEG_RE.search(line)
                if m is None:
                    raise DataPrepError(f"{args.input}: malformed <seg> line: {line[:200]!r}")
                out.write(" ".join(m.group(1).split()) + "\n")
                n += 1
    if n == 0:
        os.unlink(args.output)
        raise DataPrepError(f"{args.input}: no <seg> lines found (not a WMT .sgm file?)")
    log(f"sgm2txt {os.path.basename(args.input)}: {n:,} segments")


# -------------------------------------------------------------------------- moses

def _moses_factory(lang, normalize, aggressive):
    import regex
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    control = regex.compile(r"\p{C}")
    norm = MosesPunctNormalizer(lang=lang) if normalize else None
    tok = MosesTokenizer(lang=lang)

    def process(line):
        if norm is not None:
            line = norm.normalize(line)
            # remove-non-printing-char.perl: every control/format/unassigned char -> space
            line = control.sub(" ", line)
        line = tok.tokenize(line, aggressive_dash_splits=aggressive, return_str=True, escape=True)
        # one ASCII space between tokens, as subword-nmt and fairseq expect
        return " ".join(line.split())

    return process


def cmd_moses(args):
    """normalize-punctuation.perl | remove-non-printing-char.perl | tokenizer.perl -a -l LANG."""
    _bad_bytes.clear()
    lines = read_lines(args.inputs, max_lines=args.max_lines, errors="dataprep_replace")
    desc = f"tokenize ({args.lang}) {os.path.basename(args.output)}"
    with AtomicWriter(args.output) as out:
        map_lines(lines, _moses_factory, (args.lang, not args.no_normalize, not args.no_aggressive),
                  out, args.workers, desc, total=fast_line_count(args.inputs, args.max_lines))
    if _bad_bytes["n"]:
        log(f"warning: {_bad_bytes['n']:,} invalid UTF-8 bytes in {', '.join(args.inputs)} replaced by U+FFFD")


# ------------------------------------------------------------------- subword-learn

def _count_words_chunk(chunk):
    c = collections.Counter()
    for line in chunk:
        c.update(line.split())
    return c


def count_words(paths, workers):
    counts = collections.Counter()
    progress = Progress("count words for BPE", fast_line_count(paths))
    lines = read_lines(paths)
    chunks = iter(lambda: list(itertools.islice(lines, 20 * CHUNK_LINES)), [])
    if workers <= 1:
        for chunk in chunks:
            counts.update(_count_words_chunk(chunk))
            progress.add(len(chunk))
    else:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            pending = collections.deque()
            for chunk in chunks:
                pending.append((len(chunk), pool.apply_async(_count_words_chunk, (chunk,))))
                while len(pending) >= 2 * workers:
                    n, r = pending.popleft()
                    counts.update(r.get())
                    progress.add(n)
            for n, r in pending:
                counts.update(r.get())
                progress.add(n)
    progress.done()
    return counts


def _merge_progress(iterable):
    total = len(iterable)
    t0 = last = time.time()
    for i, x in enumerate(iterable):
        yield x
        if time.time() - last >= 10:
            last = time.time()
            log(f"learn BPE: {i + 1:,}/{total:,} merges ({time.time() - t0:.0f}s)")


def cmd_subword_learn(args):
    if args.method == "subword-nmt":
        import subword_nmt.learn_bpe
        from subword_nmt.learn_bpe import learn_bpe

        subword_nmt.learn_bpe.tqdm = _merge_progress  # log lines instead of a tqdm bar

        counts = count_words(args.inputs, args.workers)
        if not counts:
            raise DataPrepError(f"no words in {', '.join(args.inputs)}")
        log(f"learn {args.size:,} joint BPE merges (subword-nmt) from {len(counts):,} word types")
        vocab_lines = (f"{w} {c}\n" for w, c in counts.items())
        with AtomicWriter(args.output) as out:
            learn_bpe(vocab_lines, out, args.size, min_frequency=2, is_dict=True)
        with open(args.output, encoding="utf-8") as f:
            merges = sum(1 for _ in f) - 1
        if merges < args.size:
            log(f"note: only {merges:,} merges had frequency >= 2 (asked for {args.size:,})")
    else:
        spm_train(args)


def spm_train(args):
    import sentencepiece as spm

    if not args.output.endswith(".model"):
        raise DataPrepError(f"--output for sentencepiece must end in .model, got {args.output}")
    prefix = args.output[: -len(".model")]
    directory = os.path.dirname(os.path.abspath(prefix))
    os.makedirs(directory, exist_ok=True)
    tmpdir = tempfile.mkdtemp(prefix=".spm.", dir=directory)
    tmp_prefix = os.path.join(tmpdir, "spm")
    for p in args.inputs:
        if not os.access(p, os.R_OK):
            raise DataPrepError(f"cannot read {p}")
    log(f"train joint sentencepiece {args.spm_type} model, vocabulary {args.size:,}, "
        f"on {', '.join(os.path.basename(p) for p in args.inputs)}")
    # whitespace-normalized lines, exactly what subword-apply will encode (with
    # normalization_rule_name=identity sentencepiece would keep a tab or a
    # no-break space inside a piece, and fairseq would split that piece)
    sentences = (" ".join(line.split()) for line in read_lines(args.inputs))
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences,
            model_prefix=tmp_prefix,
            vocab_size=args.size,
            model_type=args.spm_type,
            character_coverage=1.0,
            # identity: no NFKC, so decoding gives back the original characters
            # (the references are never normalized either)
            normalization_rule_name="identity",
            input_sentence_size=args.spm_sample,
            shuffle_input_sentence=True,
            num_threads=max(1, args.workers),
            minloglevel=1,
        )
    except RuntimeError as e:
        msg = str(e)
        hint = " (the vocabulary is too large for this corpus: lower --bpe-size)" if "ocab" in msg else ""
        raise DataPrepError(f"sentencepiece training failed: {msg.strip()}{hint}") from None
    os.replace(tmp_prefix + ".vocab", prefix + ".vocab")
    os.replace(tmp_prefix + ".model", prefix + ".model")  # the model last: it marks completion
    os.rmdir(tmpdir)


# ------------------------------------------------------------------- subword-apply

def _bpe_factory(codes):
    from subword_nmt.apply_bpe import BPE

    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f)

    def process(line):
        return bpe.process_line(" ".join(line.split())).strip()

    return process


def _spm_factory(model):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model)

    def process(line):
        return " ".join(sp.encode(" ".join(line.split()), out_type=str))

    return process


def cmd_subword_apply(args):
    if not os.access(args.model, os.R_OK):
        raise DataPrepError(f"cannot read subword model {args.model}")
    if len(args.files) % 2:
        raise DataPrepError("subword-apply takes pairs of files: IN OUT [IN OUT ...]")
    factory = _bpe_factory if args.method == "subword-nmt" else _spm_factory
    for inp, outp in zip(args.files[::2], args.files[1::2]):
        with AtomicWriter(outp) as out:
            map_lines(read_lines([inp]), factory, (args.model,), out, args.workers,
                      f"{args.method} {os.path.basename(inp)}", total=fast_line_count([inp]))


def cmd_spm_decode(args):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=args.model)
    with AtomicWriter(args.output) as out:
        for line in read_lines([args.input]):
            out.write(sp.decode(line.split()) + "\n")


# --------------------------------------------------------------------------- clean

def cmd_clean(args):
    """Keep a pair when both sides have min..max tokens and neither is more than
    `ratio` times longer than the other (ratio 0: no ratio test), as in Moses
    clean-corpus-n.perl. Empty lines always go."""
    src_in, tgt_in, src_out, tgt_out = args.files
    kept = dropped_len = dropped_ratio = 0
    src_lines, tgt_lines = read_lines([src_in]), read_lines([tgt_in])
    with AtomicWriter(src_out) as fs, AtomicWriter(tgt_out) as ft:
        for pair in itertools.zip_longest(src_lines, tgt_lines):
            if None in pair:
                short = src_in if pair[0] is None else tgt_in
                raise DataPrepError(f"{src_in} and {tgt_in} have different line counts ({short} ends first)")
            s, t = (" ".join(x.split()) for x in pair)
            ns, nt = len(s.split()), len(t.split())
            if not (args.min <= ns <= args.max and args.min <= nt <= args.max) or ns == 0 or nt == 0:
                dropped_len += 1
            elif args.ratio and (ns > args.ratio * nt or nt > args.ratio * ns):
                dropped_ratio += 1
            else:
                fs.write(s + "\n")
                ft.write(t + "\n")
                kept += 1
    total = kept + dropped_len + dropped_ratio
    log(f"clean {os.path.basename(src_in)}/{os.path.basename(tgt_in)}: kept {kept:,} of {total:,} pairs "
        f"(dropped {dropped_len:,} outside {args.min}..{args.max} tokens"
        + (f", {dropped_ratio:,} with length ratio > {args.ratio}" if args.ratio else "") + ")")
    if kept == 0:
        raise DataPrepError(f"cleaning {src_in}/{tgt_in} kept no pair")


# ---------------------------------------------------------------------------- main

def positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {s!r}")
    return v


def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("sgm2txt", help="WMT .sgm -> plain text")
    s.add_argument("input")
    s.add_argument("output")
    s.set_defaults(fn=cmd_sgm2txt)

    s = sub.add_parser("moses", help="Moses normalization + tokenization (sacremoses)")
    s.add_argument("--lang", required=True)
    s.add_argument("--workers", type=positive_int, default=1)
    s.add_argument("--max-lines", type=positive_int, default=0, help="read at most N lines of each input (0: all)")
    s.add_argument("--no-normalize", action="store_true", help="tokenize only")
    s.add_argument("--no-aggressive", action="store_true", help="no aggressive hyphen splitting (-a)")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("inputs", nargs="+", help="plain or .gz files, concatenated in order")
    s.set_defaults(fn=cmd_moses)

    s = sub.add_parser("subword-learn", help="learn a joint subword model")
    s.add_argument("--method", choices=["subword-nmt", "sentencepiece"], required=True)
    s.add_argument("--size", type=positive_int, required=True,
                   help="BPE merge operations (subword-nmt) or vocabulary size (sentencepiece)")
    s.add_argument("--spm-type", choices=["unigram", "bpe"], default="unigram")
    s.add_argument("--spm-sample", type=positive_int, default=10_000_000,
                   help="sentencepiece trains on at most this many (randomly sampled) lines")
    s.add_argument("--workers", type=positive_int, default=1)
    s.add_argument("-o", "--output", required=True, help="BPE codes file, or sentencepiece PATH.model")
    s.add_argument("inputs", nargs="+")
    s.set_defaults(fn=cmd_subword_learn)

    s = sub.add_parser("subword-apply", help="segment a file with a subword model")
    s.add_argument("--method", choices=["subword-nmt", "sentencepiece"], required=True)
    s.add_argument("--model", required=True)
    s.add_argument("--workers", type=positive_int, default=1)
    s.add_argument("files", nargs="+", metavar="IN OUT", help="one or more pairs: input, output")
    s.set_defaults(fn=cmd_subword_apply)

    s = sub.add_parser("spm-decode", help="sentencepiece pieces -> text")
    s.add_argument("--model", required=True)
    s.add_argument("input")
    s.add_argument("output")
    s.set_defaults(fn=cmd_spm_decode)

    s = sub.add_parser("clean", help="length / ratio filter of a parallel corpus")
    s.add_argument("--min", type=positive_int, default=1)
    s.add_argument("--max", type=positive_int, default=250)
    s.add_argument("--ratio", type=float, default=1.5, help="0: no ratio filter")
    s.add_argument("files", nargs=4, metavar="FILE", help="SRC_IN TGT_IN SRC_OUT TGT_OUT")
    s.set_defaults(fn=cmd_clean)

    return p


def _terminate(signum, frame):
    raise SystemExit(128 + signum)  # unwinds: temporary outputs are removed


def main(argv=None):
    signal.signal(signal.SIGTERM, _terminate)
    args = build_parser().parse_args(argv)
    try:
        args.fn(args)
    except DataPrepError as e:
        log(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
