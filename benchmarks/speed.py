#!/usr/bin/env python
"""Training speed, beam-4 decoding speed and peak memory of resnmt's connections,
each as a ratio to a reference measured interleaved in the same run.

Every measurement runs in a fresh subprocess (so peak memory is that config's alone):
it builds the model through fairseq's real argument parser, trains ``--warmup`` +
``--updates`` steps (forward, backward, Adam) on the first batches of the binarized
training data, then decodes ``--decode-sentences`` validation sentences with fairseq's
``SequenceGenerator`` (beam 4). Each row compares a config with its reference
(fairseq's ``transformer`` of the same size, or the plain activation for NReLU/NSwish);
the two are measured back to back, in alternating order, once per round, and a row's
ratio is the median over rounds of the per-round ratio.

Outputs: one JSON line per row appended to ``--out`` (default
``benchmarks/results/speed.jsonl``), and the markdown table on stdout.

    python benchmarks/speed.py                         # CPU, 6+6 d=256 FFN 1024 4 heads
    python benchmarks/speed.py --device cuda --size base  # GPU, fairseq's base sizes
    python benchmarks/speed.py --device cuda --dtype bf16 --warmup 5 --updates 20  # the GPU table's runs
"""
import argparse
import json
import sys
from pathlib import Path

from eager_training import TORCH_DTYPES
from result_tables import speed_table
from rows import SPEED_ROWS
from speed_measure import measure_rounds, speed_records

from resnmt.experiment.presets import SIZES
from resnmt.experiment.results import read_jsonl
from resnmt.options import Option, add_to_command
from resnmt.study import flags, records

from campaign import files


DEVICE = Option("device", "cpu", "default: %(default)s", kind="choice", choices=("cpu", "cuda"))
DTYPE = Option("dtype", "fp32", kind="choice", choices=tuple(sorted(TORCH_DTYPES)), help=(
    "the model's precision (default: %(default)s); fp16 and bf16 (GPU only) train the way fairseq's --fp16/--bf16 do: "
    "half-precision model, float32 master weights, fp16 with a loss scale"))
MEASUREMENT = (
    Option("rounds", 3, "interleaved repeats per row (default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("warmup", 1, "untimed training updates first (default: %(default)s)", kind="int", minimum=0, metavar="N"),
    Option("updates", 3, "timed training updates (default: %(default)s)", kind="int", minimum=1, metavar="N"),
    Option("max_tokens", None, "tokens per training batch (default: 1024 on cpu, 4096 on cuda)", kind="int",
           minimum=1, metavar="N"),
    Option("decode_sentences", 48, "validation sentences decoded (default: %(default)s; 512 recommended on cuda)",
           kind="int", minimum=1, metavar="N"),
    Option("decode_batch", 16, "sentences per decoding batch (default: %(default)s)", kind="int", minimum=1,
           metavar="N"),
    Option("decode_len", 20, "every hypothesis is decoded to exactly this many tokens (default: %(default)s)",
           kind="int", minimum=1, metavar="N"),
)
RAW = (
    Option("raw", metavar="JSONL", help=(
        "every measured pair is appended here as it lands (default: OUT's name with -raw, e.g. "
        "benchmarks/results/speed-raw.jsonl)")),
    Option("from_raw", metavar="RUN_ID", help=(
        "measure nothing: summarize the rounds of run RUN_ID found in --raw (e.g. an interrupted run) and append its "
        "rows to --out (the SAS rows' vocabulary read from --data)")),
    Option("timeout", 900, "seconds allowed per measurement (default: %(default)s)", kind="int", minimum=1,
           metavar="S"),
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    files.add_data(p, binarized=True)
    add_to_command(p, [DEVICE])
    flags.add_size(p, None, "cpu = 6+6 layers d=256 FFN 1024 4 heads, base = 6+6 d=512 FFN 2048 8 heads, "
                   "tiny = 2+2 d=16 (tests) (default: cpu on --device cpu, base on cuda)")
    add_to_command(p, [DTYPE])
    flags.add_threads(p, per="measurement")
    add_to_command(p, MEASUREMENT)
    flags.add_rows(p, SPEED_ROWS)
    files.add_out(p, "speed.jsonl")
    add_to_command(p, RAW)
    return p


def main(argv=None):
    p = parser()
    a = p.parse_args(argv)
    if a.dtype != "fp32" and a.device != "cuda":
        p.error(f"--dtype {a.dtype}: half precision is measured on a GPU only (--device cuda); "
                "on the CPU use --dtype fp32")
    size_name = a.size or ("base" if a.device == "cuda" else "cpu")
    size = SIZES[size_name]
    rows = flags.chosen_rows(p, a.rows, SPEED_ROWS)
    data = flags.binarized_folder(p, a.data)
    base_spec = {
        "data": str(data.resolve()), "device": a.device, "size": list(size), "threads": a.threads,
        "warmup": a.warmup, "updates": a.updates, "max_tokens": a.max_tokens or (4096 if a.device == "cuda" else 1024),
        "dtype": a.dtype, "decode_sentences": a.decode_sentences, "decode_batch": a.decode_batch,
        "decode_len": a.decode_len,
    }
    raw_path = Path(a.raw) if a.raw else Path(a.out).with_name(Path(a.out).stem + "-raw.jsonl")
    if a.from_raw:
        run_id = a.from_raw
        raws = [r for r in read_jsonl(raw_path) if r["run_id"] == run_id]
        if not raws:
            p.error(f"--from-raw {run_id}: no measurements of that run in {raw_path}")
        base_spec, size_name, size = raws[0]["spec"], raws[0]["size_name"], tuple(raws[0]["spec"]["size"])
        machine = raws[0].get("machine") or records.machine_description(base_spec["device"])
        found = {}
        for r in raws:
            found.setdefault(r["row"], []).append(r["results"])
        per_row = {row: found[row] for row in SPEED_ROWS if row in found}
    else:
        run_id = records.run_id()
        machine = records.machine_description(a.device)
        per_row = measure_rounds(rows, base_spec, a.rounds, a.timeout, raw_path, run_id, machine, size_name)
    vocab = sum(1 for _ in open(next(data.glob("dict.*.txt")), encoding="utf-8")) + 4
    results = speed_records(per_row, base_spec, size, size_name, run_id, machine, vocab)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as f:
        for rec in results:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(speed_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
