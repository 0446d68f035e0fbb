#!/usr/bin/env python
"""Markdown tables from ``benchmarks/results/*.jsonl``.

* speed: the rows of the latest ``speed.py`` run for each (device, size) found in
  ``speed.jsonl`` (ratios are medians over interleaved rounds, [min–max] beside them),
  plus the SAS overhead analysis;
* fp16: the latest ``fp16.py`` run (each kind trained with ``fairseq-train --fp16``/``--bf16``),
  and the latest ``fp16.py --headroom`` measurements (what fp16 would have to hold);
* quality: one row per configuration (and settings) in ``quality.jsonl`` with n (runs),
  mean sacreBLEU, standard deviation and the seeds, and the planned rows still missing;
* GPU training (``gpu_train.jsonl``): fairseq's Trainer per configuration and whole
  fairseq-train processes, per device;
* the curves study (``curves.jsonl``; campaign/tables.py): sacreBLEU per row and budget, the
  paired differences, the results at a glance and the cross-layer verdicts.

    python benchmarks/make_tables.py                    # print the tables
    python benchmarks/make_tables.py --write docs/benchmarks.md --write docs/study.md --write docs/study-results.md --write README.md
        # replace the text between each table's markers (<!-- speed-table:begin --> /
        # <!-- speed-table:end -->, quality-table, fp16-table, fp16-headroom-table,
        # speed-glance, gpu-train-table, curves-table, glance-table, cross-layer-table) in the file that holds them

The figures of the curves study are plot_curves.py's.
"""
import argparse
import sys
from pathlib import Path

import result_tables
from result_tables import (decode_speed_tables, fp16_tables, gpu_tables, headroom_tables, quality_table, replace_between,
                           speed_glance, speed_tables)

from resnmt.experiment.results import read_jsonl
from resnmt.options import Option, add_to_command

from campaign import tables as study_tables
from campaign.files import RESULTS

MARKERS = {**result_tables.MARKERS, **study_tables.MARKERS}  # table name -> the comments around it in a document


OPTIONS = (
    Option("results", str(RESULTS), "directory of *.jsonl (default: benchmarks/results)", metavar="DIR"),
    Option("quality_settings", metavar="KEY",
           help="settings key of the quality runs to tabulate (default: the key with the most runs)"),
    Option("write", [], "replace each table whose marker comments this file holds (repeatable)", repeat=True,
           metavar="MD"),
)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to_command(p, OPTIONS)
    a = p.parse_args(argv)
    records = []
    for path in sorted(Path(a.results).glob("*.jsonl")):
        records += read_jsonl(path)
    speed = speed_tables([r for r in records if r.get("benchmark") == "speed"])
    quality = quality_table([r for r in records if r.get("benchmark") == "quality"], a.quality_settings)
    fp16 = fp16_tables([r for r in records if r.get("benchmark") == "fp16"])
    headroom = headroom_tables([r for r in records if r.get("benchmark") == "fp16-headroom"])
    glance = speed_glance([r for r in records if r.get("benchmark") == "speed"],
                          [r for r in records if r.get("benchmark") == "gpu_train"])
    gpu = gpu_tables([r for r in records if r.get("benchmark") == "gpu_train"])
    study = study_tables.tables(study_tables.runs_of(records))
    decode = decode_speed_tables([r for r in records if r.get("benchmark") == "decode_speed"])
    tables = {"speed": speed, "quality": quality, "fp16": fp16, "fp16-headroom": headroom, "speed-glance": glance,
              "gpu-train": gpu, "decode-speed": decode, **study}
    for path in a.write:  # each file gets the tables whose markers it holds (each table lives in one file)
        text = Path(path).read_text(encoding="utf-8")
        if not any(begin in text for begin, _ in MARKERS.values()):
            p.error(f"--write {path}: it holds none of the tables' markers ({', '.join(MARKERS)})")
        for name, body in tables.items():
            text = replace_between(text, *MARKERS[name], body, required=False)
        Path(path).write_text(text, encoding="utf-8")
    print("## Speed and memory\n\n" + speed + "\n\n## Quality\n\n" + quality + "\n\n## Half precision\n\n" + fp16
          + "\n\n" + headroom + "\n\n## GPU training\n\n" + gpu
          + "\n\n## Decoding speed\n\n" + decode + "\n\n## BLEU against the training budget\n\n" + "\n".join(study.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
