"""The tables of the benchmarks' results, as the documents and the scripts' output hold
them: speed (speed.py's rows, the SAS overhead, speed at a glance), quality, half
precision (fp16.py and its headroom) and GPU training (gpu_train.py); the marker comments
a document holds a generated table between, and the replacement of one. The curves
study's tables are study_tables.py's. make_tables.py writes them into the documents.
"""
import math
import statistics
from collections import Counter, OrderedDict

from stats import identical_noise, noise_floor
from verdicts import PREDICTION_TARGET_DEFAULT, PREDICTION_TARGETS, RESOLVE_ROUNDS, pair_resolution, target_verdict

from campaign.rows import QUALITY_ROWS


def fmt_ratio(x):
    return "n/a" if x is None else f"{x:.3f}"


def speed_table(rows):
    """The table of speed.py's rows (its stdout, and make_tables.py's speed tables)."""
    out = [
        "| row | train tok/s ratio (target) | | decode sent/s ratio (target) | | peak memory ratio (target) | | params ratio | rounds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t, d, m = r["train_ratio"], r["decode_ratio"], r["memory_ratio"]
        out.append(
            f"| {r['row']} (vs {r['reference']}) "
            f"| {fmt_ratio(t['median'])} [{fmt_ratio(t['min'])}–{fmt_ratio(t['max'])}] ({r['target_train'] or '—'}) "
            f"| {target_verdict(t['median'], r['target_train'])} "
            f"| {fmt_ratio(d['median'])} [{fmt_ratio(d['min'])}–{fmt_ratio(d['max'])}] ({r['target_decode'] or '—'}) "
            f"| {target_verdict(d['median'], r['target_decode'])} "
            f"| {fmt_ratio(m['median'])} ({('≤ %s' % r['target_memory']) if r['target_memory'] else '—'}) "
            f"| {target_verdict(m['median'], r['target_memory'], higher_is_better=False)} "
            f"| {r['params_ratio']:.3f} | {r['rounds']} |"
        )
    return "\n".join(out)


def fp16_table(records):
    """fp16.py's table: does each kind train in half precision?"""
    lines = ["| kind | overflowed updates (post-LN's) | final loss scale | train loss at the end | exit | verdict |",
             "|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['row']} | {r['overflows']} ({r['baseline_overflows']}) | {r['loss_scale']} "
                     f"| {r['train_loss']} @ {r['updates_logged']} | {r['exit_code']} "
                     f"| {'pass' if r['passed'] else 'FAIL'} |")
    return "\n".join(lines)


def headroom_table(records):
    """fp16.py --headroom's table: the largest values fp16 would have to hold."""
    lines = ["| kind | loss | gradient norm | largest gradient (parameter) | largest loss scale fp16 holds "
             "| largest block output (block) | largest logit |",
             "|---|---:|---:|---|---:|---|---:|"]
    for r in records:
        name = f"{r['row']} @ {r['updates']} updates" if r.get("updates") else r["row"]
        scale = r["max_fp16_loss_scale"]
        lines.append(f"| {name} | {r['loss']:.3f} | {r['grad_norm']:.2f} | {r['largest_grad']:,.0f} "
                     f"(`{r['largest_grad_param']}`) | {f'{scale:,.0f}' if scale >= 100 else f'{scale:.3g}'} "
                     f"| {r['largest_block_output']:.1f} ({r['largest_block_output_at']}) | {r['largest_logit']:.1f} |")
    return "\n".join(lines)


def gpu_training_table(rows) -> str:
    """gpu_train.py's table: tokens/s of each configuration, its ratio to its reference with
    the noise floor of its job beside it (two identical configurations' ratio, rounds the
    same), and the verdict; then whether the same-math pair resolves 2 %."""
    noise = noise_floors(rows)
    lines = ["| config | dtype | max tokens | target tok/update | tokens/s median (each round) | ratio median "
             "(each round) | noise floor | reference | target | meets | MFU |", "|" + "---|" * 11]
    for r in rows:
        tokens = f"{r['tokens_per_s']:,.0f} ({each_round(r, 'tokens_per_s', '{:,.0f}')})"
        ratio = f"{r['ratio']:.3f} ({each_round(r, 'ratio', '{:.3f}')})" if "ratio" in r else ""
        lines.append(f"| {r['config']} | {r['dtype']} | {r['max_tokens']} | {r['target_tokens_per_update']:.0f} | "
                     f"{tokens} | {ratio} | {noise_cell(noise[noise_group_of(r)]) if ratio else ''} | "
                     f"{r.get('reference', '')} | {r.get('target', '')} | {r.get('meets', '')} | {mfu_cell(r)} |")
    for r in (r for r in rows if r["config"] == "post_ln" and "resolves" in r):
        reasons = pair_resolution(r, noise[noise_group_of(r)])
        verdict = ("does NOT resolve 2 %: " + "; ".join(reasons) if reasons else
                   f"resolves (within 2 %, spread under 2 %, over {r['rounds']} rounds, identical configurations "
                   f"within {100 * noise[noise_group_of(r)]:.1f} %)")
        lines.append(f"\nsame-math pair post_ln/transformer ({r['dtype']}, {r['max_tokens']}): ratio {r['ratio']:.3f}, "
                     f"spread {100 * r['spread']:.1f} %: {verdict}")
    return "\n".join(lines)


def noise_group_of(r) -> tuple:
    """The job and token setting of a gpu_train.py row: what one noise floor covers."""
    return r.get("job"), r["max_tokens"]


def noise_floors(rows) -> dict:
    """{(job, max tokens): the noise floor of its rows (None: not measured)}."""
    settings = OrderedDict()
    for r in rows:
        settings.setdefault(noise_group_of(r), []).append(r)
    return {key: identical_noise(same) for key, same in settings.items()}


def noise_cell(noise) -> str:
    return "not measured" if noise is None else f"±{100 * noise:.1f} %"


def mfu_cell(r) -> str:
    """A row's MFU, naming the peak's dtype where it is not the dtype the row trained in
    (lines written before the peak was measured per dtype took every row's against bf16's)."""
    if "mfu" not in r:
        return ""
    peak = r.get("peak_dtype", "bf16")
    return f"{100 * r['mfu']:.1f} %" + ("" if peak == r["dtype"] else f" (of the {peak} peak)")


def each_round(r, key, fmt) -> str:
    """A row's values round by round (``key_rounds``), or its min-max where they were not kept."""
    values = r.get(f"{key}_rounds")
    if values:
        return " · ".join(fmt.format(v) for v in values)
    return f"{fmt.format(r[key + '_min'])}-{fmt.format(r[key + '_max'])}"


def with_rounds_of_two(r, first):
    """A two-round line written before each round's values were kept, with them recovered
    from ``first``, the same job's one-round line of the configuration: round 2 is the one of
    the line's min and max that round 1 is not."""
    if r.get("tokens_per_s_rounds") or r["rounds"] != 2 or first is None:
        return r
    r = dict(r)
    for key in ("tokens_per_s", "ratio"):
        if key in r and key in first:
            one = first[key]
            two = r[f"{key}_max"] if r[f"{key}_min"] == one else r[f"{key}_min"]
            r[f"{key}_rounds"] = [one, two]
    return r


def gpu_tables(records) -> str:
    """gpu_train.py's results (``benchmark == "gpu_train"``), per device: the trainer table
    (each configuration's line with the most rounds of the newest job that measured it) and
    the whole fairseq-train processes (fairseq's own wps; the resnmt runs against stock)."""
    rows, whole, first_rounds, summaries = OrderedDict(), OrderedDict(), {}, OrderedDict()
    for r in records:
        if r.get("kind") == "row":
            key = (r["device"], r["dtype"], r["max_tokens"], r["config"])
            if r["rounds"] == 1:
                first_rounds[key + (r["job"],)] = r
            old = rows.get(key)
            if old is None or (r["job"], r["rounds"]) >= (old["job"], old["rounds"]):
                rows[key] = with_rounds_of_two(r, first_rounds.get(key + (r["job"],)))
        elif r.get("kind") == "whole_process" and "error" not in r:
            # the newest run of each (lines from before the token setting was recorded: 4096)
            whole[(r["device"], r.get("tokens", 4096), r["run"], r.get("repeat", 1))] = r
        elif r.get("kind") == "whole_summary":
            key = (r["device"], r["tokens"], r["run"])
            if key not in summaries or (r["job"], r["rounds"]) >= (summaries[key]["job"], summaries[key]["rounds"]):
                summaries[key] = r  # the line with the most rounds of the newest job
    parts = []
    for device in OrderedDict.fromkeys([k[0] for k in rows] + [k[0] for k in whole] + [k[0] for k in summaries]):
        mine = [r for k, r in rows.items() if k[0] == device]
        if mine:
            parts.append(f"**{device}, fairseq's Trainer** (jobs {', '.join(sorted({r['job'] for r in mine}))})\n\n"
                         + gpu_training_table(mine))
        for tokens in OrderedDict.fromkeys(k[1] for k in whole if k[0] == device):
            firsts = {k[2]: r for k, r in whole.items() if k[:2] == (device, tokens) and k[3] == 1}
            # a repeated run beside the newest first run of its name, from the same job
            runs = [r for k, r in whole.items()
                    if k[:2] == (device, tokens) and k[2] in firsts and r["job"] == firsts[k[2]]["job"]]
            parts.append(whole_process_table(device, runs))
        for tokens in OrderedDict.fromkeys(k[1] for k in summaries if k[0] == device):
            parts.append(whole_rounds_table(device, [r for k, r in summaries.items() if k[:2] == (device, tokens)]))
    return "\n\n".join(parts) if parts else "_no GPU training results yet_"


def whole_rounds_table(device, lines) -> str:
    """The whole processes of one device and token setting run in interleaved rounds
    (whole_processes.py's summary lines): each run's steady-state wps round by round, its
    per-round ratio to stock of its size, the noise floor beside it, the verdict, MFU."""
    out = [f"**{device}, whole processes in interleaved rounds** ({lines[0]['tokens']} tokens per update; "
           "steady-state wps: the median of each process's later epochs; the ratio to the reference of the same "
           "round; jobs " + ", ".join(sorted({r["job"] for r in lines})) + ")", "",
           "| run | precision | rounds | steady wps median (each round) | ratio median (each round) | noise floor "
           "| reference | target | meets | resolves | MFU (6ND) |", "|" + "---|" * 11]
    for r in lines:
        wps = f"{r['wps_steady']:,.0f} ({' · '.join(f'{x:,.0f}' for x in r['wps_steady_rounds'])})"
        ratio = (f"{r['ratio']:.3f} ({' · '.join(f'{x:.3f}' for x in r['ratio_rounds'])})" if "ratio" in r else "")
        mfu = (f"{100 * r['mfu_6nd']:.1f} % (of the {r['peak_dtype']} peak)" if "mfu_6nd" in r else "")
        out.append(f"| {r['run']} | {r['precision']} | {r['rounds']} | {wps} | {ratio} | "
                   f"{noise_cell(r['noise_floor']) if ratio else ''} | {r.get('reference', '')} | "
                   f"{r.get('target', '')} | {r.get('meets', '')} | {r.get('resolves', '')} | {mfu} |")
    return "\n".join(out)


def whole_process_table(device, runs) -> str:
    """The whole fairseq-train processes of one device: each run's wps against stock's, and
    under the table the noise floor (a run repeated in its job against its first)."""
    stock = next((r for r in runs if r["run"].startswith("stock_") and r.get("repeat", 1) == 1), None)
    repeated = any(r.get("repeat", 1) > 1 for r in runs)
    size = "big" if stock and "_big_" in stock["run"] else "base"
    lines = [f"**{device}, whole fairseq-train processes** ({size} size, {runs[0].get('tokens', 4096)} tokens per "
             f"update, {runs[0]['updates']} updates each; fairseq's own wps per logged interval, median (min-max) "
             f"of the {runs[0]['wps_intervals']} intervals after the warm-up; one process each"
             + (" (a run named again: the same command line repeated)" if repeated else "") + ", one after "
             "the other; the first epoch, where every batch shape is new, and the later ones apart "
             "where the run logged its epochs; jobs " + ", ".join(sorted({r["job"] for r in runs})) + ")",
             "", "| run | precision | wps median (min-max) | median / stock's | first epoch | later epochs "
             "| later / stock's | losses against stock's | process s |",
             "|---|---|---|---:|---:|---:|---:|---|---:|"]

    def by_epoch(r, part):
        v = r.get(f"wps_median_{part}")
        return f"{v:,.0f} ({r[f'wps_intervals_{part}']})" if v else ""

    def over_stock(r, key):
        return (f"{r[key] / stock[key]:.2f}" if stock and r is not stock and r.get(key) and stock.get(key) else "")

    for r in runs:
        diff = (f"max abs difference {r['max_abs_loss_diff_vs_stock']:.3g} at {r['loss_diff_updates']} "
                "logged intervals" if "max_abs_loss_diff_vs_stock" in r else "")
        name = r["run"] + (f" (repeat {r['repeat']})" if r.get("repeat", 1) > 1 else "")
        lines.append(f"| {name} | {r['precision']} | {r['wps_median']:,.0f} ({r['wps_min']:,.0f}-"
                     f"{r['wps_max']:,.0f}) | {over_stock(r, 'wps_median')} | {by_epoch(r, 'first_epoch')} | "
                     f"{by_epoch(r, 'later_epochs')} | {over_stock(r, 'wps_median_later_epochs')} | {diff} | "
                     f"{r['wall_s']:.0f} |")
    floors = {key: [noise_floor([r[key] / first[key]]) for first in runs if first.get("repeat", 1) == 1
                    for r in runs if r is not first and r["run"] == first["run"] and r["job"] == first["job"]
                    and r.get(key) and first.get(key)]
              for key in ("wps_median", "wps_median_later_epochs")}
    if floors["wps_median"]:
        lines.append("\nNoise floor of the ratios (a run repeated in its job against its first): "
                     f"±{100 * max(floors['wps_median']):.1f} % in the median wps"
                     + (f", ±{100 * max(floors['wps_median_later_epochs']):.1f} % in the later epochs'"
                        if floors["wps_median_later_epochs"] else ""))
    else:
        lines.append("\nNoise floor of the ratios: not measured (no run repeated in its job)")
    return "\n".join(lines)


def replace_between(text, begin, end, body, required=True):
    """``text`` with ``body`` between the marker lines ``begin`` and ``end`` (a generated table)."""
    if begin not in text or end not in text:
        if not required:
            return text
        raise SystemExit(f"markers {begin} / {end} not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


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
    "gpu-train": ("<!-- gpu-train-table:begin -->", "<!-- gpu-train-table:end -->"),
    "decode-speed": ("<!-- decode-speed-table:begin -->", "<!-- decode-speed-table:end -->"),
}

DECODE_ENGINES = {"fairseq": "fairseq-generate's search", "fast": "resnmt's fast beam search",
                  "ctranslate2": "CTranslate2 float32"}


def _setting(s):
    return f"--max-tokens {s[6:]}" if s.startswith("tokens") else f"batch {s}"


def decode_speed_tables(records):
    """decode_speed.py's tables from its latest run's measurements: per model, each engine's least
    CPU seconds over the rounds at each batch setting (sentences per CPU second, the ratio to
    fairseq's search); the whole processes; every kind at batch 32. The noise floor is fairseq's
    search measured twice in each round."""
    records = [r for r in records if "cpu_s" in r]
    if not records:
        return "(no decode_speed.py measurements)"
    latest = {}  # each (part, model, kind): the latest run that measured it
    for r in records:
        key = (r["part"], r["model"], r["kind"])
        latest[key] = max(latest.get(key, ""), r["run_id"])
    records = [r for r in records if r["run_id"] == latest[(r["part"], r["model"], r["kind"])]]
    run = ", ".join(sorted(set(latest.values())))
    groups = OrderedDict()
    for r in records:
        groups.setdefault((r["part"], r["model"], r["kind"], r["setting"]), []).append(r)

    def cell(recs, engine):
        own = [r["cpu_s"] for r in recs if r["engine"] == engine]
        ref = [r["cpu_s"] for r in recs if r["engine"] == "fairseq"]
        if not own:
            return "—", None
        best = min(own)
        text = f"{best:.2f} s ({recs[0]['sentences'] / best:.0f}/s)"
        if ref and engine != "fairseq":
            text += f" **{min(ref) / best:.2f}x**"
        return text, best

    def noise(recs):
        pairs = [a["cpu_s"] / b["cpu_s"] for a in recs if a["engine"] == "fairseq" and a["repeat"] == 1
                 for b in recs if b["engine"] == "fairseq" and b["repeat"] == 2 and b["round"] == a["round"]]
        return noise_floor(pairs) if pairs else None

    m = records[0]["machine"]

    def rounds(keys):
        return max(r["round"] for k in keys for r in groups[k])

    out = [f"**cpu, beam 4, {records[0]['threads']} thread per engine** — runs {run}, interleaved rounds, "
           f"the least CPU seconds of the decode over the rounds (sentences per CPU second; **the ratio to "
           f"fairseq's search**); machine: {m.get('cpus')} CPUs shared with other jobs, torch {m.get('torch')}", ""]
    decode = [k for k in groups if k[0] == "decode"]
    for model in OrderedDict.fromkeys(k[1] for k in decode):
        keys = [k for k in decode if k[1] == model]
        first = groups[keys[0]][0]
        weights = ("trained" if first["weights"] == "trained"
                   else f"random weights, every hypothesis cut at {first['max_len_b']} tokens, where fairseq's "
                        "search ends it with an EOS and CTranslate2 does not: its lines differ there")
        out += [f"*{model} post-LN ({weights}), the first {first['sentences']} test2016 sentences, "
                f"rounds: {rounds(keys)}:*", "",
                "| engine | " + " | ".join(_setting(k[3]) for k in keys) + " | lines differing from fairseq |",
                "|---|" + "---:|" * len(keys) + "---:|"]
        for engine, name in DECODE_ENGINES.items():
            cells = [cell(groups[k], engine)[0] for k in keys]
            differing = [r["lines_differing"] for k in keys for r in groups[k]
                         if r["engine"] == engine and r.get("lines_differing") is not None]
            diff = "—" if engine == "fairseq" else (str(max(differing)) if differing else "n/a")
            out.append(f"| {name} | " + " | ".join(cells) + f" | {diff} |")
        floors = [noise(groups[k]) for k in keys]
        out += ["", "Noise floor (fairseq's search measured twice per round): "
                + ", ".join(f"{_setting(k[3])} {f * 100:.0f} %" for k, f in zip(keys, floors) if f is not None), ""]
    whole = [k for k in groups if k[0] == "whole"]
    for key in whole:
        recs = groups[key]
        out += [f"*Whole process, start-up included, {key[1]} post-LN (trained), all {recs[0]['sentences']:,} test "
                "sentences, "
                f"{_setting(key[3])}, rounds: {rounds([key])} (CPU seconds of the process):*", "",
                "| engine | CPU s | ratio to fairseq |",
                "|---|---:|---:|"]
        ref = min(r["cpu_s"] for r in recs if r["engine"] == "fairseq")
        for engine, name in DECODE_ENGINES.items():
            own = [r["cpu_s"] for r in recs if r["engine"] == engine]
            if own:
                out.append(f"| {name} | {min(own):.2f} | {ref / min(own):.2f}x |")
        floor = noise(recs)
        out += ["", f"Noise floor: {floor * 100:.0f} %" if floor is not None else "", ""]
    for key in (k for k in groups if k[0] == "profile"):
        out += profile_table(key, groups[key]) + [""]
    kinds = [k for k in groups if k[0] == "kinds"]
    if kinds:
        first = groups[kinds[0]][0]
        out += [f"*Every kind, {first['model']} (random weights, hypotheses cut at {first['max_len_b']} tokens), "
                f"the first {first['sentences']} sentences, batch 32, rounds: {rounds(kinds)}:*", "",
                "| kind | fairseq-generate's search | resnmt's fast beam search | speed-up | lines differing |",
                "|---|---:|---:|---:|---:|"]
        for key in kinds:
            recs = groups[key]
            ref, fast = cell(recs, "fairseq")[1], cell(recs, "fast")[1]
            differing = [r["lines_differing"] for r in recs
                         if r["engine"] == "fast" and r.get("lines_differing") is not None]
            out.append(f"| {key[2]} | {ref:.2f} s | {fast:.2f} s | {ref / fast:.2f}x | "
                       f"{max(differing) if differing else 'n/a'} |")
        floor = noise(groups[kinds[0]])
        if floor is not None:
            out += ["", f"Noise floor ({kinds[0][2]}'s fairseq search measured twice per round): {floor * 100:.0f} %"]
    return "\n".join(out).rstrip()


def profile_table(key, recs):
    """decode_speed.py --profile: each search's round of least CPU seconds split into its parts
    (CPU seconds and share of the whole)."""
    engines = [e for e in ("fairseq", "fast") if any(r["engine"] == e for r in recs)]
    best = {e: min((r for r in recs if r["engine"] == e), key=lambda r: r["cpu_s"]) for e in engines}
    first = recs[0]
    weights = ("trained" if first["weights"] == "trained"
               else f"random weights, hypotheses cut at {first['max_len_b']} tokens")
    out = [f"*Where the time goes, {key[1]} post-LN ({weights}), the first {first['sentences']:,} test2016 "
           f"sentences, {_setting(key[3])}, rounds: {max(r['round'] for r in recs)} (each search's round of least "
           "CPU seconds, split into its parts: CPU seconds and share):*", "",
           "| part | " + " | ".join(DECODE_ENGINES[e] for e in engines) + " |",
           "|---|" + "---:|" * len(engines)]
    for part in first["parts"]:
        out.append(f"| {part} | " + " | ".join(
            f"{best[e]['parts'][part]:.2f} s ({best[e]['parts'][part] / best[e]['cpu_s'] * 100:.0f} %)"
            for e in engines) + " |")
    out.append("| **all** | " + " | ".join(f"**{best[e]['cpu_s']:.2f} s**" for e in engines) + " |")
    return out


def speed_tables(records):
    """speed.py's tables, on the CPU. On a GPU the update of these models is bound by the host,
    and speed.py's ratios there spread by ±15 % between identical configurations: the GPU
    numbers come from fairseq's trainer (gpu_train.py, the noise floor measured beside each
    ratio); speed.py's GPU lines stay in speed.jsonl, out of the table."""
    groups = OrderedDict()
    for r in records:
        if r["settings"]["device"] != "cpu":
            continue
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
                    f"| {r['train_ratio']['median']:.3f} | {mp:.3f} (≥ {target:g}: {target_verdict(mp, target)}) |"
                )
        parts.append("")
    return "\n".join(parts) if parts else "_no speed results yet_"


# the glance's rows: speed.py's row name -> gpu_train.py's configuration of the same kind
GLANCE_ROWS = {"pre_ln": "pre_ln", "rskip_ln (λ=2)": "rskip_ln", "deepnorm": "deepnorm", "sas (gate h)": "sas",
               "sas (gate 64)": "sas_gate64", "nswish vs swish": "nswish"}
GLANCE_GPU_TOKENS = 4096


def gpu_glance_ratios(gpu_records, tokens=GLANCE_GPU_TOKENS) -> dict:
    """{gpu_train configuration: its latest training ratio to its reference in bf16 at
    ``tokens``}, only where that ratio is measured over RESOLVE_ROUNDS rounds or more beside a
    measured noise floor (fewer rounds, or none beside it, resolve nothing on a GPU)."""
    ratios = {}
    for r in gpu_records:
        if (r.get("kind") == "row" and r.get("dtype") == "bf16" and r.get("max_tokens") == tokens
                and r.get("ratio") is not None and r.get("rounds", 0) >= RESOLVE_ROUNDS
                and r.get("noise_floor") is not None):
            ratios[r["config"]] = (r["ratio"], r["noise_floor"], r.get("device", "GPU"))
    return ratios


def speed_glance(records, gpu_records=(), rows=GLANCE_ROWS):
    """Speed at a glance: a few rows of the CPU speed table (the latest run that measured each
    row): training and decoding throughput and peak memory as ratios to the row's reference;
    and each row's training ratio on a GPU through fairseq's trainer, where one is resolved
    (:func:`gpu_glance_ratios`)."""
    latest = {}
    for r in sorted(records, key=lambda r: r["run_id"]):
        if r["settings"]["device"] == "cpu":
            latest[r["row"]] = r
    if not any(row in latest for row in rows):
        return "_no speed results yet_"
    gpu = gpu_glance_ratios(gpu_records)
    gpu_shown = any(config in gpu for config in rows.values())
    head = "CPU train | CPU decode | CPU memory" + (" | GPU bf16 train (noise floor) |" if gpu_shown else " |")
    lines = [f"| row (ratio to its reference) | {head}", "|---|" + "---:|" * (3 + gpu_shown)]
    for row, config in rows.items():
        r = latest.get(row)
        cells = [f"{r[k]['median']:.2f}" for k in ("train_ratio", "decode_ratio", "memory_ratio")] if r else [""] * 3
        if gpu_shown:
            ratio, noise, _ = gpu.get(config, (None, None, None))
            cells.append(f"{ratio:.2f} (±{100 * noise:.0f} %)" if ratio is not None else "")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    if not gpu_shown:
        lines.append(f"\nOn a GPU no kind's training ratio is measured yet over {RESOLVE_ROUNDS} or more rounds "
                     "beside a noise floor (docs/benchmarks.md, GPU training through fairseq's trainer).")
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
    order = {row: i for i, row in enumerate(QUALITY_ROWS)}
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
    for row, n_wanted in ((name, r.seeds) for name, r in QUALITY_ROWS.items()):
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
    return latest_run_tables(records, "precision", ("fp16", "bf16"), fp16_caption, fp16_table,
                             "_no half-precision runs yet (they need a GPU)_")


def fp16_caption(precision: str, rows) -> str:
    s, latest = rows[0]["settings"], rows[0]["run_id"]
    return (f"**fairseq-train --{precision}**, run {latest} on {rows[0]['device_name']}: "
            f"{s['size']} size, {s['updates']} updates of ≤{s['max_tokens']} tokens, lr {s['lr']} "
            f"({s['warmup_updates']} warm-up), dropout {s['dropout']}; a kind passes when it ends with a "
            f"finite loss and no more overflowed (skipped) updates than post-LN")


def headroom_tables(records):
    """The latest ``fp16.py --headroom`` run at initialization, and at trained checkpoints."""
    return latest_run_tables(records, "at", ("initialization", "checkpoint"), headroom_caption, headroom_table,
                             "_no headroom measurements yet_")


def headroom_caption(at: str, rows) -> str:
    s, latest = rows[0]["settings"], rows[0]["run_id"]
    what = (f"**fairseq-train's first step** ({s['size']} size at initialization, batches of "
            f"≤{s['max_tokens']} tokens, dropout {s['dropout']})" if at == "initialization"
            else "**One training step of trained checkpoints** (each with its own size, batch size and dropout)")
    return (f"{what} in float32 on the CPU (`fp16.py --headroom`), run {latest}: the first batch of "
            f"epoch 1; loss and gradient norm as fairseq logs them")


def latest_run_tables(records, field: str, values, caption, table, none_yet: str) -> str:
    """For each of ``values`` of ``field``, the latest run with it: ``caption(value, rows)`` and
    ``table(rows)``; ``none_yet`` where no run has any."""
    parts = []
    for value in values:
        rows = latest_run(records, field, value)
        if not rows:
            continue
        parts.append(caption(value, rows) + "\n")
        parts.append(table(rows) + "\n")
    return "\n".join(parts) if parts else none_yet
