#!/usr/bin/env python
"""Markdown tables from ``benchmarks/results/*.jsonl``.

* speed: the rows of the latest ``speed.py`` run for each (device, size) found in
  ``speed.jsonl`` (ratios are medians over interleaved rounds, [min–max] beside them),
  plus the SAS overhead analysis;
* fp16: the latest ``fp16.py`` run (each kind trained with ``fairseq-train --fp16``/``--bf16``),
  and the latest ``fp16.py --headroom`` measurements (what fp16 would have to hold);
* quality: one row per configuration (and settings) in ``quality.jsonl`` with n (runs),
  mean sacreBLEU, standard deviation and the seeds, and the planned rows still missing.

    python benchmarks/make_tables.py                    # print the tables
    python benchmarks/make_tables.py --write docs/benchmarks.md --write docs/study.md --write README.md
        # replace the text between each table's markers (<!-- speed-table:begin --> /
        # <!-- speed-table:end -->, quality-table, fp16-table, fp16-headroom-table,
        # speed-glance) in the file that holds them
"""
import argparse
import math
import statistics
import sys
from collections import Counter, OrderedDict
from pathlib import Path

from common import (PREDICTION_TARGET_DEFAULT, PREDICTION_TARGETS, ROWS, fp16_table, headroom_table, replace_between,
                    speed_table)

from resnmt.experiment.results import read_jsonl

HERE = Path(__file__).resolve().parent

# the papers' direction, for comparison (IWSLT'15 EN-VI base unless said otherwise)
PAPERS = {
    "transformer": "baseline (SAS paper 30.9, rSkip paper 30.3 on EN-VI)",
    "post_ln": "= fairseq transformer (rSkip Table 2: 30.31)",
    "pre_ln": "pre-LN: no EN-VI number in the papers",
    "xskip (λ=1)": "worse than post-LN: 28.98 vs 30.31 (rSkip Table 2)",
    "xskip_ln (λ=2)": "better: 30.99 (rSkip Table 2)",
    "rskip_ln (λ=2)": "best: 31.45 (rSkip Table 2; 2-layer model 30.49 vs 30.04)",
    "rskip_ln (λ=3)": "better, below λ=2: 31.10 (rSkip Table 2)",
    "sas": "better: 32.0 vs 30.9 (SAS paper)",
    "highway": "worse: CIFAR-10 92.15 vs 93.66 (SAS paper Table 6, 'Transform Gate'); no NMT number",
    "rskip_ln (λ=2) + nswish": "no paper number for this combination",
    "xskip_ln (learned λ from 2)": "worse than fixed λ (rSkip paper, learned-λ ablation)",
    "deepnorm": "no EN-VI number; DeepNet's claim is stable training of very deep models, where post-LN diverges",
    "rezero": "no NMT number; ReZero's claim is faster convergence than post-LN (language modelling)",
    "admin": "no EN-VI number; Admin's claim is post-LN's quality without its instability in deep models",
}

MARKERS = {
    "speed": ("<!-- speed-table:begin -->", "<!-- speed-table:end -->"),
    "quality": ("<!-- quality-table:begin -->", "<!-- quality-table:end -->"),
    "fp16": ("<!-- fp16-table:begin -->", "<!-- fp16-table:end -->"),
    "fp16-headroom": ("<!-- fp16-headroom-table:begin -->", "<!-- fp16-headroom-table:end -->"),
    "speed-glance": ("<!-- speed-glance:begin -->", "<!-- speed-glance:end -->"),
}


def speed_tables(records):
    groups = OrderedDict()
    for r in records:
        key = (r["settings"]["device"], r["size"]["name"], r["settings"].get("dtype", "fp32"))
        groups.setdefault(key, []).append(r)
    parts = []
    for (device, size_name, dtype), recs in groups.items():
        # each row from the latest run that measured it (a run may measure some rows only)
        latest_per_row = OrderedDict()
        for r in sorted(recs, key=lambda r: r["run_id"]):
            latest_per_row.pop(r["row"], None)
            latest_per_row[r["row"]] = r
        rows = sorted(latest_per_row.values(), key=lambda r: r["run_id"])
        runs = list(OrderedDict.fromkeys(r["run_id"] for r in rows))
        latest = ", ".join(runs)
        s, z, m = rows[0]["settings"], rows[0]["size"], rows[0]["machine"]
        parts.append(
            f"**{device}{'' if dtype == 'fp32' else ' ' + dtype}, {z['layers']}+{z['layers']} layers d={z['dim']} "
            f"FFN {z['ffn']} {z['heads']} heads** — "
            f"run{'s' if len(runs) > 1 else ''} {latest} (each row: the latest run that measured it; ratios within a run; rounds per row in the table), {s['threads']} torch thread(s) per measurement, "
            f"{s['warmup']} warm-up + {s['updates']} timed updates of ≤{s['max_tokens']} tokens, "
            f"beam 4 on {s['decode_sentences']} sentences ({s['decode_batch']} per batch, {s['decode_len']} tokens each); "
            f"machine: {m.get('gpu') or str(m.get('cpus')) + ' CPUs'}, torch {m.get('torch', '?')}\n"
        )
        parts.append(speed_table(rows))
        sas = [r for r in rows if "sas_overhead" in r]
        if sas:
            parts.append("\nSAS gate overhead (analytic, per target token; formula in docs/benchmarks.md, \"SAS overhead, analytically\"):\n")
            parts.append("| row | gate hidden g | gate params | params ratio (measured) | gate MACs / model MACs "
                         "| predicted train ratio | measured train ratio | measured / predicted (target) |")
            parts.append("|---|---|---|---|---|---|---|---|")
            for r in sas:
                o = r["sas_overhead"]
                mp = o.get("measured_over_predicted")
                target = PREDICTION_TARGETS.get(r["row"], PREDICTION_TARGET_DEFAULT)
                parts.append(
                    f"| {r['row']} | {o['gate_dim']} | {o['gate_params']:,} | {r['params_ratio']:.3f} "
                    f"| {o['mac_overhead']:.3f} | {o['predicted_train_ratio']:.3f} "
                    f"| {r['train_ratio']['median']:.3f} | {mp:.3f} (≥ {target:g}: {'pass' if mp >= target else 'MISS'}) |"
                )
        parts.append("")
    return "\n".join(parts) if parts else "_no speed results yet_"


GLANCE_ROWS = ("pre_ln", "rskip_ln (λ=2)", "deepnorm", "sas (gate h)", "sas (gate 64)", "nswish vs swish")
GLANCE_GROUPS = (("cpu", "fp32", "CPU"), ("cuda", "bf16", "GPU bf16"))


def speed_glance(records, rows=GLANCE_ROWS, groups=GLANCE_GROUPS):
    """Speed at a glance: a few rows of the speed tables (the latest run that measured each
    row, per device and dtype), training and decoding throughput and peak memory as ratios
    to the row's reference."""
    latest = {}
    for r in sorted(records, key=lambda r: r["run_id"]):
        latest[(r["settings"]["device"], r["settings"].get("dtype", "fp32"), r["row"])] = r
    present = [g for g in groups if any((g[0], g[1], row) in latest for row in rows)]
    if not present:
        return "_no speed results yet_"
    head = " | ".join(f"{name} train | {name} decode | {name} memory" for _, _, name in present)
    lines = [f"| row (ratio to its reference) | {head} |", "|---|" + "---:|" * (3 * len(present))]
    for row in rows:
        cells = []
        for device, dtype, _ in present:
            r = latest.get((device, dtype, row))
            cells += ([f"{r[k]['median']:.2f}" for k in ("train_ratio", "decode_ratio", "memory_ratio")]
                      if r else ["", "", ""])
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def quality_table(records, settings_key=None):
    """The table for one settings key: ``settings_key``, or the one with the most runs.
    Runs under other settings are counted in a note, not mixed into the rows."""
    runs_per_key = Counter(r["settings_key"] for r in records)
    if settings_key is None and runs_per_key:
        settings_key = max(runs_per_key, key=lambda k: (runs_per_key[k], max(
            r.get("finished", "") for r in records if r["settings_key"] == k)))
    others = {k: n for k, n in runs_per_key.items() if k != settings_key}
    records = [r for r in records if r["settings_key"] == settings_key]
    groups = OrderedDict()
    for r in records:
        groups.setdefault((r["row"], r["settings_key"]), []).append(r)
    lines = [
        "| row | n | sacreBLEU mean | std | min–max | seeds | papers' direction |",
        "|---|---|---|---|---|---|---|",
    ]
    order = {row: i for i, row in enumerate(ROWS)}
    settings_seen = OrderedDict()
    for (row, key), recs in sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1])):
        recs = sorted(recs, key=lambda r: r["seed"])
        bleus = [r["bleu"] for r in recs]
        std = statistics.stdev(bleus) if len(bleus) > 1 else float("nan")
        settings_seen[key] = recs[0]["settings"]
        lines.append(
            f"| {row}{'' if len(settings_seen) == 1 else f' [{key}]'} | {len(bleus)} | {statistics.mean(bleus):.2f} "
            f"| {'—' if math.isnan(std) else f'{std:.2f}'} | {min(bleus):.2f}–{max(bleus):.2f} "
            f"| {','.join(str(r['seed']) for r in recs)} | {PAPERS.get(row, '')} |"
        )
    missing = []
    for row, n_wanted in ((name, r.seeds) for name, r in ROWS.items()):
        have = sum(len(v) for (r, _), v in groups.items() if r == row)
        if have < n_wanted:
            missing.append(f"{row} ({have} of {n_wanted} seeds)")
    out = "\n".join(lines)
    for key, s in settings_seen.items():
        z = s["size"]
        out += (f"\n\nSettings {key}: {z['layers']}+{z['layers']} layers d={z['dim']} FFN {z['ffn']} {z['heads']} heads, "
                f"{s['max_tokens']} tokens/batch, {s['max_update']} updates, lr {s['lr']} (inverse sqrt, "
                f"{s['warmup_updates']} warm-up), dropout {s['dropout']}, label smoothing {s['label_smoothing']}, "
                f"average of the last {s['average']} checkpoints (every {s['save_every']} updates), beam {s['beam']}, "
                f"{s['lenpen_form']} lenpen {s['lenpen']}, {s['threads']} thread(s).")
    out += "\n\nNot yet run: " + ("; ".join(missing) if missing else "none") + "."
    if others:
        out += ("\n\nNot in this table (other settings; `make_tables.py --quality-settings KEY` shows them): "
                + ", ".join(f"{k} ({n} run{'s' if n > 1 else ''})" for k, n in sorted(others.items())) + ".")
    return out


def latest_run(records, setting: str, value) -> list:
    """The records of the newest run (``run_id``) among those whose ``settings[setting]`` is ``value``."""
    recs = [r for r in records if r["settings"].get(setting) == value]
    latest = max((r["run_id"] for r in recs), default=None)
    return [r for r in recs if r["run_id"] == latest]


def fp16_tables(records):
    """The latest ``fp16.py`` run per precision: does each kind train in half precision?"""
    parts = []
    for precision in ("fp16", "bf16"):
        rows = latest_run(records, "precision", precision)
        if not rows:
            continue
        s, latest = rows[0]["settings"], rows[0]["run_id"]
        parts.append(f"**fairseq-train --{precision}**, run {latest} on {rows[0]['device_name']}: "
                     f"{s['size']} size, {s['updates']} updates of ≤{s['max_tokens']} tokens, lr {s['lr']} "
                     f"({s['warmup_updates']} warm-up), dropout {s['dropout']}; a kind passes when it ends with a "
                     f"finite loss and no more overflowed (skipped) updates than post-LN\n")
        parts.append(fp16_table(rows) + "\n")
    return "\n".join(parts) if parts else "_no half-precision runs yet (they need a GPU)_"


def headroom_tables(records):
    """The latest ``fp16.py --headroom`` run at initialization, and at trained checkpoints."""
    parts = []
    for at in ("initialization", "checkpoint"):
        rows = latest_run(records, "at", at)
        if not rows:
            continue
        s, latest = rows[0]["settings"], rows[0]["run_id"]
        what = (f"**fairseq-train's first step** ({s['size']} size at initialization, batches of "
                f"≤{s['max_tokens']} tokens, dropout {s['dropout']})" if at == "initialization"
                else "**One training step of trained checkpoints** (each with its own size, batch size and dropout)")
        parts.append(f"{what} in float32 on the CPU (`fp16.py --headroom`), run {latest}: the first batch of "
                     f"epoch 1; loss and gradient norm as fairseq logs them\n")
        parts.append(headroom_table(rows) + "\n")
    return "\n".join(parts) if parts else "_no headroom measurements yet_"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=str(HERE / "results"), help="directory of *.jsonl (default: benchmarks/results)")
    p.add_argument("--quality-settings", metavar="KEY",
                   help="settings key of the quality runs to tabulate (default: the key with the most runs)")
    p.add_argument("--write", metavar="MD", action="append", default=[],
                   help="replace each table whose marker comments this file holds (repeatable)")
    a = p.parse_args(argv)
    records = []
    for path in sorted(Path(a.results).glob("*.jsonl")):
        records += read_jsonl(path)
    speed = speed_tables([r for r in records if r.get("benchmark") == "speed"])
    quality = quality_table([r for r in records if r.get("benchmark") == "quality"], a.quality_settings)
    fp16 = fp16_tables([r for r in records if r.get("benchmark") == "fp16"])
    headroom = headroom_tables([r for r in records if r.get("benchmark") == "fp16-headroom"])
    glance = speed_glance([r for r in records if r.get("benchmark") == "speed"])
    tables = {"speed": speed, "quality": quality, "fp16": fp16, "fp16-headroom": headroom, "speed-glance": glance}
    for path in a.write:  # each file gets the tables whose markers it holds (each table lives in one file)
        text = Path(path).read_text(encoding="utf-8")
        if not any(begin in text for begin, _ in MARKERS.values()):
            p.error(f"--write {path}: it holds none of the tables' markers ({', '.join(MARKERS)})")
        for name, body in tables.items():
            text = replace_between(text, *MARKERS[name], body, required=False)
        Path(path).write_text(text, encoding="utf-8")
    print("## Speed and memory\n\n" + speed + "\n\n## Quality\n\n" + quality + "\n\n## Half precision\n\n" + fp16
          + "\n\n" + headroom)
    return 0


if __name__ == "__main__":
    sys.exit(main())
