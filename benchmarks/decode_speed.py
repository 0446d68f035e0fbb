#!/usr/bin/env python
"""Beam-4 decoding speed on the CPU: resnmt's fast beam search, fairseq-generate's search and
CTranslate2 (float32, the same weights converted by ``resnmt-export``), side by side.

Measured as a user meets them, one torch (and CTranslate2) thread each:

* **the decode**: CPU seconds (``time.process_time``) and wall seconds of decoding the first
  ``--sentences`` Multi30k test2016 sentences of each model, beam 4, fairseq's length
  normalization, at batch 1, 32, 128 and ``--max-tokens 4096`` (``--settings``); the three
  engines measured in one process per model (the model loaded once), interleaved in rounds
  (the order reversed every other round), fairseq's search measured twice in each round:
  the two are the noise floor. The lines whose best hypothesis differs from fairseq's are
  counted (a model of random weights decodes to the length limit, where the engines part).
* **the whole process** (``--whole``, the trained model only): ``fairseq-generate`` with
  ``--beam-search fairseq`` and ``fast``, and a Python process that reads the raw test text,
  segments it with the data's sentencepiece model and translates it with CTranslate2,
  start-up included, at batch 128; CPU seconds of the process (``wait4``'s rusage).
* **every kind** (``--kinds``): the fast search against fairseq's at batch 32, a 2+2 d=128
  model of each kind with random weights.
* **where the time goes** (``--profile``, the 2+2 model): each search's CPU seconds at batch
  ``--profile``, split into data loading (fairseq's batches collated), the encoder, the decoder
  layers, the output projection and log-softmax, the decoder cache's reorder, the search's own
  bookkeeping (the rest of the decode) and detokenization (the best hypotheses to text,
  sentencepiece removed); the calls timed by wrapping the model's and the stepper's methods.

Models: the study's 2+2 d=128 (trained: ``--small-checkpoint``, e.g. 800 updates of the
small preset; else random weights), its 6+6 d=128 and fairseq's base size (random
weights, every hypothesis cut at ``--random-max-len`` tokens so that every engine decodes
the same number of steps). Each measurement is a JSON line appended to ``--out``; the
table (the least CPU seconds over the rounds, sentences/s, the ratios to fairseq's search,
the noise floor) is printed, and make_tables.py writes it into docs/decoding-and-evaluation.md.

    python benchmarks/decode_speed.py --small-checkpoint runs/post_ln_small/checkpoint_last.pt
    python benchmarks/decode_speed.py --models small --settings 32,128 --rounds 5
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from resnmt.experiment.presets import SIZES
from resnmt.experiment.results import append_jsonl
from resnmt.options import Option, add_to_command
from resnmt.study import flags, records

from campaign import files

BENCHMARK = "decode_speed"
ENGINES = ("fairseq", "fast", "ctranslate2")
REFERENCE = "fairseq"
MODELS = {"small": "2+2 d=128", "deep": "6+6 d=128", "base": "6+6 d=512 (base)"}
SETTINGS = ("1", "32", "128", "tokens4096")
BEAM = 4
TRANSLATE_CT2 = r"""
import sys, time
import ctranslate2, sentencepiece
model, spm, source, batch, out = sys.argv[1:6]
sp = sentencepiece.SentencePieceProcessor(model_file=spm)
lines = open(source, encoding="utf-8").read().splitlines()
translator = ctranslate2.Translator(model, device="cpu", inter_threads=1, intra_threads=1)
results = translator.translate_batch([sp.encode(l, out_type=str) for l in lines], beam_size=4,
                                     max_batch_size=int(batch), max_decoding_length=200)
with open(out, "w", encoding="utf-8") as f:
    for r in results:
        f.write(sp.decode(r.hypotheses[0]) + "\n")
"""

OPTIONS = (
    Option("models", ",".join(MODELS), "comma-separated models: " + ", ".join(f"{k} ({v})" for k, v in MODELS.items())
           + " (default: %(default)s)", metavar="LIST"),
    Option("settings", ",".join(SETTINGS), "comma-separated batch settings: a number of sentences per batch, or "
           "tokensN for --max-tokens N (default: %(default)s)", metavar="LIST"),
    Option("rounds", 3, "interleaved rounds (default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("sentences", "1000,200,100", "test sentences decoded per model, in --models' order "
           "(default: %(default)s)", metavar="LIST"),
    Option("small_checkpoint", metavar="FILE", help=(
        "a trained 2+2 d=128 post_ln checkpoint of the data (the small preset); default: random weights")),
    Option("random_max_len", 25, "with random weights, every hypothesis is cut at this many tokens "
           "(--max-len-a 0 --max-len-b N; default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("whole", 128, "batch size of the whole-process runs of the trained model (0: none; default: %(default)s)",
           kind="int", minimum=0, metavar="B"),
    Option("kinds", 100, "test sentences of the every-kind comparison at batch 32 (0: none; default: %(default)s)",
           kind="int", minimum=0, metavar="N"),
    Option("profile", 32, "batch size of the where-the-time-goes split of both searches, 2+2 model "
           "(0: none; default: %(default)s)", kind="int", minimum=0, metavar="B"),
    Option("worker", metavar="JSON", help="(used by the benchmark itself) measure one model in this process"),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    files.add_data(p, binarized=False)
    flags.add_threads(p, per="engine")
    add_to_command(p, OPTIONS)
    files.add_out(p, "decode_speed.jsonl")
    return p


# ------------------------------------------------------------------------------------ the worker


def size_flags(name: str):
    size = SIZES[name]
    return size.fairseq_flags()


def build_model(data: Path, kind: str, size: str, checkpoint, max_len: int):
    """(model, task, generation limit) of a checkpoint, or of ``kind`` at ``size`` with random weights."""
    import torch
    from fairseq import checkpoint_utils, options, tasks

    import resnmt  # noqa: F401

    if checkpoint:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task(
            [str(checkpoint)], arg_overrides={"data": str(data)})
        return models[0].eval(), task, None
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        str(data), "--task", "resnmt_translation", "--arch", "resnmt_transformer", "--residual", kind,
        "--share-all-embeddings", *size_flags(size)])
    task = tasks.setup_task(args)
    torch.manual_seed(1)
    return task.build_model(args).eval(), task, max_len


def batches(task, sentences: int, setting: str):
    """The test set's first ``sentences`` sentences in fairseq-generate's batches of ``setting``
    (its length order, ``--batch-size`` or ``--max-tokens``), collated."""
    import numpy as np

    dataset = task.dataset("test")
    order = np.array([i for i in dataset.ordered_indices() if i < sentences], dtype=np.int64)
    tokens = setting.startswith("tokens")
    groups = dataset.batch_by_size(order, max_tokens=int(setting[6:]) if tokens else None,
                                   max_sentences=None if tokens else int(setting), required_batch_size_multiple=1)
    return [dataset.collater([dataset[int(i)] for i in group]) for group in groups]


def generators(model, task, max_len):
    from fairseq import search
    from fairseq.sequence_generator import SequenceGenerator

    from resnmt.decoding.fast_beam import FastSequenceGenerator

    tgt = task.target_dictionary
    kwargs = dict(beam_size=BEAM, max_len_a=0, max_len_b=max_len or 200,
                  search_strategy=search.BeamSearch(tgt))
    return {"fairseq": SequenceGenerator([model], tgt, **kwargs), "fast": FastSequenceGenerator([model], tgt, **kwargs)}


def decode_torch(generator, model, samples):
    import torch

    hyps = {}
    with torch.no_grad():
        for sample in samples:
            out = generator.generate([model], sample)
            for sid, h in zip(sample["id"].tolist(), out):
                hyps[sid] = h[0]["tokens"].tolist()
    return hyps


def measure(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    result = fn()
    return result, time.process_time() - c0, time.perf_counter() - w0


def worker(spec: dict) -> None:
    """One model size, one or more kinds: every setting and engine, interleaved in rounds, a
    JSON line per measurement on stdout."""
    import torch

    torch.set_num_threads(spec["threads"])
    for kind in spec["kinds"]:
        (profile_model if spec["part"] == "profile" else measure_model)(spec, kind)


def loaded(spec: dict, kind: str):
    """(model, task with its test set, generation limit, both searches' generators, sentences to
    decode, the fields naming this model in each line) of a worker's spec."""
    model, task, max_len = build_model(Path(spec["data"]), kind, spec["size"], spec.get("checkpoint"),
                                       spec["random_max_len"])
    task.load_dataset("test")
    n = min(spec["sentences"], len(task.dataset("test")))
    named = {"model": spec["model"], "kind": kind, "weights": "trained" if spec.get("checkpoint") else "random",
             "max_len_b": max_len or 200}
    return model, task, max_len, generators(model, task, max_len), n, named


def measure_model(spec: dict, kind: str) -> None:
    engines = spec["engines"]
    model, task, max_len, gens, n, named = loaded(spec, kind)
    translator = None
    if "ctranslate2" in engines:
        import ctranslate2

        from resnmt.export.ctranslate2 import export_ctranslate2

        folder = Path(tempfile.mkdtemp(prefix="decode_speed-")) / "ct2"
        export_ctranslate2(model, task, folder)
        translator = ctranslate2.Translator(str(folder), device="cpu", inter_threads=1,
                                            intra_threads=spec["threads"])
    dataset = task.dataset("test")
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    sources = [[src_dict[i] for i in dataset[k]["source"][:-1]] for k in range(n)]
    samples = {s: batches(task, n, s) for s in spec["settings"]}
    reference_hyps = {}

    def run(engine, setting, first=None):
        if engine == "ctranslate2":
            tokens = setting.startswith("tokens")
            results = translator.translate_batch(
                sources[:first], beam_size=BEAM, max_batch_size=int(setting[6:]) if tokens else int(setting),
                batch_type="tokens" if tokens else "examples", max_decoding_length=max_len or 200)
            return {k: [tgt_dict.index(t) for t in r.hypotheses[0]] + [tgt_dict.eos()] for k, r in enumerate(results)}
        return decode_torch(gens[engine], model, samples[setting][:1 if first else None])

    for engine in engines:  # untimed: each engine's first call (lazy set-up) on one batch
        run(engine, spec["settings"][0], first=8)
    for rnd in range(1, spec["rounds"] + 1):
        order = engines + [REFERENCE] if spec.get("noise", True) else list(engines)
        order = order if rnd % 2 else list(reversed(order))
        for setting in spec["settings"]:
            seen = set()
            for engine in order:
                repeat = 2 if engine in seen else 1
                seen.add(engine)
                hyps, cpu, wall = measure(lambda: run(engine, setting))
                if engine == REFERENCE and setting not in reference_hyps:
                    reference_hyps[setting] = hyps
                ref = reference_hyps.get(setting)
                differing = None if ref is None else sum(hyps.get(k) != ref[k] for k in ref)
                print(json.dumps({**named, "setting": setting, "engine": engine, "round": rnd, "repeat": repeat,
                                  "cpu_s": cpu, "wall_s": wall, "sentences": len(hyps), "lines_differing": differing,
                                  **({"search": gens["fast"].fallback or "fast"} if engine == "fast" else {})}),
                      flush=True)


OUTPUT = "output projection + log-softmax"
PROFILE_PARTS = ("data loading", "encoder", "decoder layers", OUTPUT, "cache reorder", "search bookkeeping",
                 "detokenization")


class PartClock:
    """CPU seconds spent inside wrapped methods, per part of the decode."""

    def __init__(self):
        self.spent = dict.fromkeys(PROFILE_PARTS, 0.0)

    @contextlib.contextmanager
    def wrapping(self, methods):
        """``methods``: (object, method name, part); each timed on the object while inside."""
        for owner, name, part in methods:
            setattr(owner, name, self._timed(getattr(owner, name), part))
        try:
            yield
        finally:
            for owner, name, _ in methods:
                delattr(owner, name)  # the class's method again

    def _timed(self, inner, part):
        def timed(*args, **kwargs):
            t0 = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.spent[part] += time.process_time() - t0
        return timed


def timed_methods(engine: str, model, generator) -> list:
    """What each search calls for each part: fairseq's through its ensemble (the encoder, the
    decoder's features and output layer, the normalized probabilities, the reorders), the fast
    one through its stepper (whose encoder part holds the encoder-decoder keys and values,
    which fairseq's decoder computes at its first step)."""
    if engine == "fairseq":
        return [(model.encoder, "forward", "encoder"), (model.decoder, "extract_features", "decoder layers"),
                (model.decoder, "output_layer", OUTPUT), (model, "get_normalized_probs", OUTPUT),
                (model.decoder, "reorder_incremental_state_scripting", "cache reorder"),
                (model.encoder, "reorder_encoder_out", "cache reorder")]
    stepper = generator._stepper
    return [(stepper, "encode", "encoder"), (stepper, "features", "decoder layers"), (stepper, "_log_probs", OUTPUT),
            (stepper, "_reorder", "cache reorder")]


def profile_model(spec: dict, kind: str) -> None:
    """Each search's decode at one batch size split into PROFILE_PARTS, in interleaved rounds."""
    import torch

    model, task, _, gens, n, named = loaded(spec, kind)
    setting = spec["settings"][0]
    tgt = task.target_dictionary
    for engine in ("fairseq", "fast"):  # untimed: lazy set-up (the fast search's stepper)
        decode_torch(gens[engine], model, batches(task, 8, setting)[:1])
    for rnd in range(1, spec["rounds"] + 1):
        for engine in ("fairseq", "fast") if rnd % 2 else ("fast", "fairseq"):
            clock = PartClock()
            c0 = time.process_time()
            samples = batches(task, n, setting)
            clock.spent["data loading"] = time.process_time() - c0
            with clock.wrapping(timed_methods(engine, model, gens[engine])):
                hyps, decode_s, wall = measure(lambda: decode_torch(gens[engine], model, samples))
            c0 = time.process_time()
            with torch.no_grad():
                text = [tgt.string(torch.tensor(h), "sentencepiece") for h in hyps.values()]
            clock.spent["detokenization"] = time.process_time() - c0
            clock.spent["search bookkeeping"] = decode_s - sum(clock.spent[p] for p in PROFILE_PARTS[1:5])
            print(json.dumps({**named, "setting": setting, "engine": engine, "round": rnd, "repeat": 1,
                              "cpu_s": sum(clock.spent.values()), "decode_s": decode_s, "wall_s": wall,
                              "parts": clock.spent, "sentences": len(text)}), flush=True)


# ------------------------------------------------------------------------------------ the parent


def run_worker(spec: dict, out: Path, common: dict) -> list:
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=log, text=True, env=dict(os.environ, OMP_NUM_THREADS=str(spec["threads"])))
    lines = []
    for line in proc.stdout:
        if line.startswith("{"):
            rec = {"benchmark": BENCHMARK, "part": spec["part"], **common, **json.loads(line)}
            append_jsonl(out, rec)
            lines.append(rec)
            print(f"[decode_speed] {rec['model']} {rec['kind']} {rec['setting']} {rec['engine']} "
                  f"round {rec['round']}: {rec['cpu_s']:.2f} CPU s ({rec['wall_s']:.2f} s wall)", file=sys.stderr,
                  flush=True)
    log.seek(0)
    err = log.read()
    if proc.wait() != 0:
        raise SystemExit(f"[decode_speed] error: the worker of {spec['model']} failed:\n{err[-3000:]}")
    return lines


def whole_processes(a, data: Path, checkpoint: Path, out: Path, common: dict) -> list:
    """fairseq-generate (both searches) and CTranslate2's own process, each start-up included, in rounds."""
    bin_dir = data / "bin"
    sentences = len((data / "raw" / "test.en").read_text(encoding="utf-8").splitlines())
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    lines = []
    with tempfile.TemporaryDirectory(prefix="decode_speed-") as scratch:
        ct2 = Path(scratch) / "ct2"
        subprocess.run([sys.executable, "-m", "resnmt.cli.export", "--path", str(checkpoint), "--data", str(data),
                        "--format", "ctranslate2", "--output", str(ct2)], check=True, capture_output=True, env=env)
        bindir = Path(sys.executable).parent
        commands = {
            engine: [str(bindir / "fairseq-generate"), str(bin_dir), "--user-dir", str(files.REPO_ROOT / "resnmt"),
                     "--task", "resnmt_translation", "--beam-search", engine, "--path", str(checkpoint),
                     "--gen-subset", "test", "--beam", str(BEAM), "--batch-size", str(a.whole),
                     "--post-process", "sentencepiece", "--cpu", "--num-workers", "0"]
            for engine in ("fairseq", "fast")}
        commands["ctranslate2"] = [sys.executable, "-c", TRANSLATE_CT2, str(ct2), str(data / "spm" / "spm.model"),
                                   str(data / "raw" / "test.en"), str(a.whole), str(Path(scratch) / "ct2.out")]
        for rnd in range(1, a.rounds + 1):
            order = list(ENGINES) + [REFERENCE]
            order = order if rnd % 2 else list(reversed(order))
            seen = set()
            for engine in order:
                repeat = 2 if engine in seen else 1
                seen.add(engine)
                t0 = time.perf_counter()
                with open(Path(scratch) / "out", "w") as sink:
                    proc = subprocess.Popen(commands[engine], stdout=sink, stderr=subprocess.STDOUT, env=env)
                    _, status, usage = os.wait4(proc.pid, 0)
                if os.waitstatus_to_exitcode(status) != 0:
                    raise SystemExit(f"[decode_speed] error: {' '.join(commands[engine][:3])} failed:\n"
                                     + (Path(scratch) / "out").read_text()[-3000:])
                rec = {"benchmark": BENCHMARK, "part": "whole", **common, "model": MODELS["small"], "kind": "post_ln",
                       "setting": str(a.whole), "engine": engine, "round": rnd, "repeat": repeat,
                       "cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": time.perf_counter() - t0,
                       "sentences": sentences, "weights": "trained"}
                append_jsonl(out, rec)
                lines.append(rec)
                print(f"[decode_speed] whole process {engine} round {rnd}: {rec['cpu_s']:.2f} CPU s", file=sys.stderr,
                      flush=True)
    return lines


def main(argv=None):
    p = parser()
    a = p.parse_args(argv)
    if a.worker:
        worker(json.loads(a.worker))
        return 0
    data = Path(a.data)
    if not (data / "bin").is_dir() or not (data / "raw" / "test.en").is_file():
        p.error(f"--data {data}: not a prepared corpus (resnmt-prepare multi30k {data})")
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        p.error(f"--models {','.join(bad)}: choose among {', '.join(MODELS)}")
    settings = [s.strip() for s in a.settings.split(",") if s.strip()]
    bad = [s for s in settings if not (s.isdigit() or (s.startswith("tokens") and s[6:].isdigit()))]
    if bad:
        p.error(f"--settings {','.join(bad)}: a number of sentences per batch, or tokensN")
    counts = [int(x) for x in a.sentences.split(",")]
    if len(counts) < len(models):
        p.error(f"--sentences {a.sentences}: one count per model ({len(models)})")
    out = Path(a.out)
    common = {"run_id": records.run_id(), "machine": records.machine_description("cpu"), "threads": a.threads,
              "beam": BEAM}
    lines = []
    for model, n in zip(models, counts):
        checkpoint = a.small_checkpoint if model == "small" else None
        lines += run_worker({"part": "decode", "model": MODELS[model], "kinds": ["post_ln"], "size": model,
                             "checkpoint": checkpoint, "sentences": n, "settings": settings, "rounds": a.rounds,
                             "engines": list(ENGINES), "data": str(data / "bin"), "threads": a.threads,
                             "random_max_len": a.random_max_len}, out, common)
    if a.whole and a.small_checkpoint:
        lines += whole_processes(a, data, Path(a.small_checkpoint), out, common)
    if a.kinds:
        from resnmt.connections import BUILTIN_KINDS

        lines += run_worker({"part": "kinds", "model": MODELS["small"], "kinds": list(BUILTIN_KINDS), "size": "small",
                             "sentences": a.kinds, "settings": ["32"], "rounds": a.rounds,
                             "engines": ["fairseq", "fast"], "data": str(data / "bin"), "threads": a.threads,
                             "random_max_len": a.random_max_len}, out, common)
    if a.profile:
        sentences = dict(zip(models, counts)).get("small", 1000)
        lines += run_worker({"part": "profile", "model": MODELS["small"], "kinds": ["post_ln"], "size": "small",
                             "checkpoint": a.small_checkpoint, "sentences": sentences,
                             "settings": [str(a.profile)], "rounds": a.rounds, "data": str(data / "bin"),
                             "threads": a.threads, "random_max_len": a.random_max_len}, out, common)
    from result_tables import decode_speed_tables

    print(decode_speed_tables(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
