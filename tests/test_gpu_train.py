"""benchmarks/gpu_train.py in its CPU smoke mode: configurations built from fairseq-train
command lines and trained through fairseq's Trainer, interleaved rounds, ratios to the
reference rows, FLOPs counted, a profile of one update, and a whole fairseq-train
process whose wps is read from fairseq's own log. (The GPU run: benchmarks/gpu_job.sh.)"""
import json
import statistics
import sys

import pytest

from conftest import REPO_ROOT, run_cli

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_train.py"


@pytest.mark.slow  # the lab's GPU benchmark rehearsed on the CPU (45 s): with the slow tests
def test_smoke_run_on_the_cpu(tiny_bin, tmp_path):
    out, profile = tmp_path / "rows.jsonl", tmp_path / "profile.json"
    proc = run_cli([sys.executable, SCRIPT, "--smoke", "--cpu", "--data", tiny_bin, "--out", out,
                    "--rows", "transformer,post_ln", "--tokens", "600", "--warmup", "2", "--updates", "2",
                    "--rounds", "2", "--batches", "3", "--profile", profile, "--compile-backend", "eager", "--whole-process",
                    "--whole-runs", "stock_fairseq_train_fp16,resnmt_train_fast_bf16,stock_fairseq_train_fp16",
                    "--whole-rounds", "2", "--whole-updates", "4", "--whole-interval", "1", "--whole-skip", "1",
                    "--whole-tokens", "600"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    env = records[0]
    # the peak of the dtype that trained: fp32 on the CPU (bf16 may be emulated there, far slower)
    assert env["kind"] == "environment" and env["device"] == "cpu" and set(env["peak_tflops"]) == {"fp32"}
    assert env["peak_tflops"]["fp32"] > 0
    # its paths hold no machine's folders: the data led by its corpus's name, the outputs' names
    settings = env["settings"]
    assert (settings["data"], settings["out"], settings["profile"]) == (
        f"{tiny_bin.parent.name}/bin", "rows.jsonl", "profile.json")
    assert all(r["benchmark"] == "gpu_train" for r in records)
    # each round's rows are written as it finishes (a job stopped from outside keeps them)
    assert [r["rounds"] for r in records if r["kind"] == "row" and r["config"] == "post_ln"] == [1, 2]
    rows = {(r["config"], r["dtype"]): r for r in records if r["kind"] == "row"}  # the last line of each
    assert set(rows) == {("transformer", "fp32"), ("post_ln", "fp32"), ("stock_fp16", "fp32"), ("recipe", "fp32"),
                         ("recipe_compiled", "fp32")}
    post_ln, recipe = rows[("post_ln", "fp32")], rows[("recipe", "fp32")]
    assert post_ln["reference"] == "transformer/fp32" and post_ln["rounds"] == 2 and post_ln["target"] == "0.98-1.02"
    assert post_ln["ratio_min"] <= post_ln["ratio"] <= post_ln["ratio_max"]
    assert len(post_ln["tokens_per_s_rounds"]) == len(post_ln["ratio_rounds"]) == 2  # each round's, in order
    assert min(post_ln["ratio_rounds"]) == post_ln["ratio_min"]
    # the first configuration runs every batch once before timing (no round meets a shape first)
    assert rows[("transformer", "fp32")]["warmup_updates"] == 3 and post_ln["warmup_updates"] == 2
    assert rows[("recipe_compiled", "fp32")]["warmup_updates"] == 3  # and each compiled one
    # and in each round every configuration trained the same batches: the same target tokens
    tokens = {r["config"]: tuple(r["target_tokens_rounds"]) for r in rows.values()}
    assert len(set(tokens.values())) == 1 and len(next(iter(tokens.values()))) == 2, tokens
    assert recipe["reference"] == "stock_fp16/fp32" and recipe["flags"] == ["--optimizer", "adam_fused"]
    compiled = rows[("recipe_compiled", "fp32")]
    assert compiled["reference"] == "stock_fp16/fp32" and compiled["target"] == ">= 3x stock fp16"
    assert compiled["flags"] == ["--optimizer", "adam_fused", "--task", "resnmt_translation", "--compile-layers"]
    for r in rows.values():
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"] and r["tokens_per_s"] > 0
        assert r["flops_per_update"] > 0 and r["target_tokens_per_update"] > 0
        # MFU: the model FLOPs per second of the median update over the measured peak of the
        # dtype that trained (no bound below 1 asserted: a loaded CPU can time its peak low)
        seconds_per_update = statistics.median(r["target_tokens_per_update"] / tps for tps in r["tokens_per_s_rounds"])
        assert r["peak_dtype"] == r["dtype"] == "fp32" and r["peak_tflops"] == env["peak_tflops"]["fp32"]
        assert r["mfu"] == pytest.approx(r["flops_per_update"] / seconds_per_update / (r["peak_tflops"] * 1e12))
    # the compiled recipe compiled during its warm-up only (which saw every batch shape)
    assert 0 < compiled["compiled_graphs_after_warmup"] == compiled["compiled_graphs_at_end"]
    # the same model, the same math: the same FLOPs
    assert post_ln["flops_per_update"] == rows[("transformer", "fp32")]["flops_per_update"]
    assert "| post_ln | fp32 | 600 |" in proc.stdout and "same-math pair post_ln/transformer" in proc.stdout
    # the noise floor: on the CPU stock fp16 is the transformer row's command line, so no twin
    # is added, and the two give the largest per-round ratio (faster over slower) less 1,
    # stated beside every ratio; two rounds never resolve 2 % (four are needed)
    same = zip(rows[("transformer", "fp32")]["tokens_per_s_rounds"], rows[("stock_fp16", "fp32")]["tokens_per_s_rounds"])
    noise = max(max(x / y, y / x) for x, y in same) - 1
    assert all(r["noise_floor"] == pytest.approx(noise) for r in rows.values() if "ratio" in r)
    assert post_ln["resolves"] is False and "2 rounds (4 needed)" in proc.stdout

    prof = json.loads(profile.read_text())["profiles"]
    assert set(prof) == {"stock_fp16/fp32", "recipe/fp32", "recipe_compiled/fp32"}
    assert prof["stock_fp16/fp32"]["item_calls"] > 0 and prof["recipe/fp32"]["top_cpu_ops"]
    # where an update reads values on the host (on a GPU: its syncs), by line: fairseq's
    # finiteness check of the gradient norm, once per update, in every configuration
    for p in prof.values():
        reads = {(r["site"], r["read"]): r for r in p["host_reads"]}
        grad_norm_check = [r for (site, read), r in reads.items()
                           if site.startswith("fairseq/trainer.py:") and "isfinite(grad_norm)" in r["line"]]
        assert len(grad_norm_check) == 1 and grad_norm_check[0]["per_update"] == 1.0, p["host_reads"]
        assert all(r["device"] == "cpu" and r["per_update"] > 0 for r in p["host_reads"])

    whole = [r for r in records if r["kind"] == "whole_process"]
    assert len(whole) == 6 and not any("error" in r for r in whole), whole
    # two interleaved rounds, the second in reverse order (here the same: stock, fast, stock again)
    assert [(r["round"], r["run"], r["repeat"]) for r in whole] == [
        (1, "stock_fairseq_train_fp16", 1), (1, "resnmt_train_fast_bf16", 1), (1, "stock_fairseq_train_fp16", 2),
        (2, "stock_fairseq_train_fp16", 1), (2, "resnmt_train_fast_bf16", 1), (2, "stock_fairseq_train_fp16", 2)]
    stock, fast, again = whole[:3]
    # stock again: the same command line, its losses stock's to the last digit logged (the CPU
    # is deterministic), its wps against the first stock's the noise floor of the ratios
    assert again["argv"] == stock["argv"] and again["max_abs_loss_diff_vs_stock"] == 0
    assert again["loss_diff_updates"] == 4
    assert stock["run"] == "stock_fairseq_train_fp16" and stock["updates"] == 4 and stock["wps_median"] > 0
    assert stock["argv"][:4] == ["-m", "fairseq_cli.train", "--arch", "transformer"]
    assert stock["argv"][4] == f"{tiny_bin.parent.name}/bin" and not any(a.startswith("/") for a in stock["argv"])
    assert stock["device"] == "cpu" and stock["job"] == env["time"] and stock["tokens"] == 600
    assert [i["num_updates"] for i in stock["intervals"]] == [2, 3, 4]  # fairseq's own, after --whole-skip 1
    assert all(i["train_wall"] is not None and i["ups"] is not None for i in stock["intervals"])
    assert all(i["epoch"] == 1 and i["loss"] > 0 for i in stock["intervals"])  # 4 updates: the first epoch
    assert stock["wps_intervals_first_epoch"] == 3 and stock["wps_median_later_epochs"] is None
    assert stock["wps_median_first_epoch"] == stock["wps_median"] and stock["params"] > 0
    # the fast path's process: resnmt-train --fast-path; its log's buckets' padding and its
    # steps (eagerly on the CPU: no graph recorded); none of that in stock's record
    assert fast["argv"][:2] == ["-m", "resnmt.cli.train"] and "--fast-path" in fast["argv"]
    assert 0 < fast["padding_fraction"] < 1 and fast["shapes"] >= 1 and 0 < fast["fairseq_padding_fraction"] < 1
    assert fast["steps"] == "steps run eagerly" and fast["graphs"] == 0 and fast["last_update_with_a_new_graph"] is None
    assert "padding_fraction" not in stock and "graphs" not in stock
    # after each round a summary per run: steady wps round by round, the ratio to stock of the
    # same round, the noise floor (stock again against stock, the largest over the rounds)
    summaries = [r for r in records if r["kind"] == "whole_summary"]
    assert [(s["run"], s["rounds"]) for s in summaries] == [
        ("stock_fairseq_train_fp16", 1), ("resnmt_train_fast_bf16", 1),
        ("stock_fairseq_train_fp16", 2), ("resnmt_train_fast_bf16", 2)]
    fast_sum = summaries[-1]
    ratios = [f["wps_median"] / ((s["wps_median"] + s2["wps_median"]) / 2)  # stock: its round's repeats' mean
              for s, f, s2 in ((whole[0], whole[1], whole[2]), (whole[3], whole[4], whole[5]))]
    assert fast_sum["ratio_rounds"] == pytest.approx(ratios) and fast_sum["reference"] == "stock_fairseq_train_fp16"
    noise = max(max(x, 1 / x) for x in (whole[2]["wps_median"] / whole[0]["wps_median"],
                                        whole[5]["wps_median"] / whole[3]["wps_median"])) - 1
    assert fast_sum["noise_floor"] == pytest.approx(noise) and fast_sum["target"] == ">= 3x stock fairseq train fp16"
    assert "reference" not in summaries[-2]  # stock is no one's ratio: repeated, it is the noise floor
    # MFU: 6 x parameters x steady wps over the measured peak of the precision that ran
    assert fast_sum["peak_dtype"] == "fp32" and fast_sum["mfu_6nd"] == pytest.approx(
        6 * fast["params"] * fast_sum["wps_steady"] / (env["peak_tflops"]["fp32"] * 1e12))


def test_the_fast_paths_whole_processes():
    """The fast path's whole processes (gpu_job.sh part 5): resnmt-train --fast-path --bf16 (and
    without its CUDA graphs, and at transformer-big against stock's big) as rows.WHOLE_PROCESSES,
    interleaved in rounds with the order reversed every other round, each against stock
    fairseq-train of its size; the fast path's target is 3x stock."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import gpu_train
    import whole_processes

    a = gpu_train.parser().parse_args(["--data", "bin", "--out", "y", "--whole-tokens", "16384"])

    def argv(name):
        return whole_processes.whole_argv(a, name, "scratch")[1:]

    fast, eager = argv("resnmt_train_fast_bf16"), argv("resnmt_train_fast_eager_bf16")
    assert fast[:2] == ["-m", "resnmt.cli.train"] and fast[-1] == "--bf16" and "--no-step-capture" not in fast
    assert fast[fast.index("--arch") + 1] == "transformer_postln_base"
    assert "--fast-path" in fast and fast[fast.index("--optimizer") + 1] == "adam_fused"
    assert fast[fast.index("--task") + 1] == "resnmt_translation" and fast.count("--optimizer") == 1
    assert [x for x in eager if x not in fast] == ["--no-step-capture"]
    big, stock_big = argv("resnmt_train_fast_big_bf16"), argv("stock_fairseq_train_big_fp16")
    assert big[big.index("--arch") + 1] == "transformer_postln_big" and "--fast-path" in big
    assert stock_big[:4] == ["-m", "fairseq_cli.train", "--arch", "transformer_wmt_en_de_big"]
    assert stock_big[-1] == "--fp16"
    assert big[big.index("--max-tokens") + 1] == "16384"
    assert whole_processes.WHOLE_TARGETS["resnmt_train_fast_big_bf16"].reference == "stock_fairseq_train_big_fp16"
    assert whole_processes.WHOLE_TARGETS["resnmt_train_fast_bf16"].times == 3.0
    runs = ["stock", "fast", "stock", "eager"]
    assert [whole_processes.round_order(runs, r) for r in (1, 2, 3)] == [runs, runs[::-1], runs]
    plan_b = argv("resnmt_train_fast_compiled_graphs_bf16")
    assert [x for x in plan_b if x not in fast] == ["--no-step-capture", "--compile-layers", "--compile-mode",
                                                    "reduce-overhead", "--compile-backend", "inductor"]
    job = (REPO_ROOT / "benchmarks" / "gpu_job.sh").read_text()
    assert '--whole-rounds 3 --whole-runs "$stock,$fast,$fast,$stock"' in job  # A B B A
    part = {n: job[job.index(f'elif [ "$PART" = {n} ]'):] for n in (5, 8, 9)}
    assert "abba stock_fairseq_train_fp16 \"$FAST\"" in part[5] and "FAST=resnmt_train_fast_bf16" in part[5]
    assert "FAST=resnmt_train_fast_eager_bf16,resnmt_train_fast_compiled_graphs_bf16" in part[5]  # plan B
    # the fast path's own profile, bounded, after the rounds where time is left, and alone in part 10;
    # plan B can be asked for
    assert 'timeout -k 5 "$1" "$PY" benchmarks/fast_profile.py --data .gpu/multi30k/bin' in job
    assert 'then fast_profile 60; fi' in part[5] and part[5].index("abba ") < part[5].index("fast_profile 60")
    assert "fast_profile $(( $(left) - 10 ))" in job[job.index('elif [ "$PART" = 10 ]'):]
    assert '[ "${GPU_JOB_PLAN_B:-0}" = 1 ] ||' in part[5]
    assert "abba stock_fairseq_train_big_fp16 resnmt_train_fast_big_bf16 --whole-tokens $BIG_TOKENS" in part[8]
    assert "BIG_TOKENS=16384" in part[8] and "TOKENS=32768" in part[9]
    assert "abba stock_fairseq_train_fp16 resnmt_train_fast_bf16 --whole-tokens $TOKENS" in part[9]


def test_the_speed_verdict_cannot_pass_inside_the_noise_floor():
    """A 3x target passes only over at least 3 rounds whose lowest ratio, shrunk by the noise
    floor, still clears it; a round's A B B A repeats count with their mean."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import whole_processes
    from rows import WHOLE_TARGETS
    from verdicts import trainer_verdict

    fast = WHOLE_TARGETS["resnmt_train_fast_bf16"]
    clear = trainer_verdict(fast, {"ratio": 3.5, "ratio_rounds": [3.4, 3.5, 3.6]}, 0.05)
    assert clear["meets"] and clear["ratio_lower_bound"] == pytest.approx(3.4 / 1.05) and not clear["why_not"]
    inside = trainer_verdict(fast, {"ratio": 3.1, "ratio_rounds": [3.05, 3.1, 3.2]}, 0.05)  # 3.05 / 1.05 = 2.905
    assert not inside["meets"] and inside["why_not"] == (
        "the lowest round's ratio 3.050 over the noise floor (±5.0 %) is 2.905, under 3")
    two = trainer_verdict(fast, {"ratio": 5.0, "ratio_rounds": [5.0, 5.0]}, 0.01)
    assert not two["meets"] and two["why_not"] == "2 rounds (3 needed)"
    assert trainer_verdict(fast, {"ratio": 5.0, "ratio_rounds": [5.0] * 3}, None)["why_not"] == (
        "no noise floor: no run repeated in its job")

    def proc(run, rnd, repeat, wps):
        return {"run": run, "round": rnd, "repeat": repeat, "precision": "bf16", "tokens": 4096,
                "wps_median": wps}

    done = []
    for rnd, (s1, f1, f2, s2) in enumerate([(10, 40, 42, 11), (10, 41, 39, 10), (11, 33, 33, 10)], start=1):
        done += [proc("stock_fairseq_train_fp16", rnd, 1, s1), proc("resnmt_train_fast_bf16", rnd, 1, f1),
                 proc("resnmt_train_fast_bf16", rnd, 2, f2), proc("stock_fairseq_train_fp16", rnd, 2, s2)]
    line = {x["run"]: x for x in whole_processes.whole_summaries(done, {"device": "GPU X", "time": "j"})}
    summary = line["resnmt_train_fast_bf16"]
    assert summary["ratio_rounds"] == pytest.approx([41 / 10.5, 40 / 10, 33 / 10.5])
    assert summary["noise_floor"] == pytest.approx(0.1)  # 11 against 10 (rounds 1 and 3)
    assert summary["ratio_lower_bound"] == pytest.approx((33 / 10.5) / 1.1) and not summary["meets"]


def test_timed_updates_fit_the_time_left(monkeypatch):
    """--updates is cut so that every round of every configuration ends by the deadline,
    priced at the median warm-up update; never under 10, never over --updates."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import gpu_train
    import trainer_rounds

    a = gpu_train.parser().parse_args(["--data", "x", "--out", "y", "--warmup", "10", "--updates", "100",
                                       "--rounds", "3"])
    configs = [trainer_rounds.Config(n, "post_ln", "bf16", warmup_s=w, warmup_updates=u) for n, w, u in
               (("a", 16.0, 64), ("b", 2.5, 10), ("compiled", 150.0, 10))]
    # 0.25 s per update (the first configuration warmed up over 64 batches); one compiled in its warm-up
    monkeypatch.setattr(trainer_rounds.time, "monotonic", lambda: 1000.0)
    assert trainer_rounds.fit_updates(a, configs, float("inf")) == 100
    assert trainer_rounds.fit_updates(a, configs, 1000.0 + 90) == 40  # 3 rounds x 3 configurations x 0.25 s x 40 = 90 s
    assert trainer_rounds.fit_updates(a, configs, 1000.0 + 1000) == 100
    assert trainer_rounds.fit_updates(a, configs, 1000.0 + 5) == 10


def test_gpu_tables_take_each_configurations_fullest_line():
    """make_tables' GPU section: per device the trainer rows (the line with the most rounds
    of the newest job) and the whole processes against stock's, written from the lines."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from result_tables import gpu_tables

    def row(config, rounds, tps, job="2026-01-01T00:00:00Z", **extra):
        return {"benchmark": "gpu_train", "kind": "row", "config": config, "dtype": "bf16", "max_tokens": 4096,
                "job": job, "device": "GPU X", "rounds": rounds, "tokens_per_s": tps, "tokens_per_s_min": tps,
                "tokens_per_s_max": tps, "target_tokens_per_update": 3000.0, **extra}

    def whole(run, wps, **extra):
        return {"benchmark": "gpu_train", "kind": "whole_process", "run": run, "device": "GPU X", "job": "j",
                "precision": "fp16", "updates": 200, "wps_median": wps, "wps_min": wps / 2, "wps_max": wps * 2,
                "wps_intervals": 18, "wall_s": 60.0, **extra}

    later = dict(wps_median_first_epoch=5000.0, wps_intervals_first_epoch=11)
    text = gpu_tables([row("transformer", 1, 2000.0), row("transformer", 2, 1500.0, tokens_per_s_min=1000.0,
                                                          tokens_per_s_max=2000.0),
                       row("post_ln", 3, 1000.0, tokens_per_s_rounds=[900.0, 1000.0, 1100.0]),
                       whole("stock_fairseq_train_fp16", 15000.0, **later, wps_median_later_epochs=40000.0,
                             wps_intervals_later_epochs=6),
                       whole("resnmt_postln_fp16", 13500.0, max_abs_loss_diff_vs_stock=0.0, loss_diff_updates=20,
                             **later, wps_median_later_epochs=36000.0, wps_intervals_later_epochs=6)])
    # each round in order: kept in the line, or (two rounds, written before they were kept)
    # recovered from the job's one-round line
    assert "| transformer | bf16 | 4096 | 3000 | 1,500 (2,000 · 1,000) |" in text
    assert "| post_ln | bf16 | 4096 | 3000 | 1,000 (900 · 1,000 · 1,100) |" in text
    assert ("| resnmt_postln_fp16 | fp16 | 13,500 (6,750-27,000) | 0.90 | 5,000 (11) | 36,000 (6) | 0.90 | "
            "max abs difference 0 at 20 ") in text
    assert text.startswith("**GPU X, fairseq's Trainer**") and "**GPU X, whole fairseq-train processes**" in text
    assert gpu_tables([]) == "_no GPU training results yet_"
    pair = row("post_ln", 8, 1000.0, ratio=1.004, ratio_min=0.95, ratio_max=1.10, spread=0.15, resolves=False,
               ratio_q1=0.995, ratio_q3=1.012, ratio_rounds=[1.0] * 8, tokens_per_s_rounds=[1000.0] * 8)
    assert ("ratio 1.004, spread 15.0 %: does NOT resolve 2 %: rows within 15.0 % of each other cannot be separated; "
            "the middle half of the 8 rounds lies within 0.995-1.012") in gpu_tables([pair])
    # beside every ratio the noise floor of its job and token setting: two identical command
    # lines' largest per-round ratio, faster over slower (here 1,100 against 1,000 in round 2)
    ref = row("transformer", 2, 1000.0, arch="transformer", flags=[], tokens_per_s_rounds=[1000.0, 1000.0])
    twin = row("transformer_twin", 2, 1000.0, arch="transformer", flags=[], tokens_per_s_rounds=[1000.0, 1100.0],
               ratio=1.05, ratio_min=1.0, ratio_max=1.1, ratio_rounds=[1.0, 1.1], reference="transformer/bf16")
    other = row("rezero", 2, 900.0, arch="transformer_rezero_base", flags=[], tokens_per_s_rounds=[900.0, 900.0],
                ratio=0.9, ratio_min=0.9, ratio_max=0.9, ratio_rounds=[0.9, 0.9], reference="transformer/bf16")
    text = gpu_tables([ref, twin, other])
    assert "| rezero | bf16 | 4096 | 3000 | 900 (900 · 900) | 0.900 (0.900 · 0.900) | ±10.0 % | transformer/bf16 |" in text
    assert "| transformer | bf16 | 4096 | 3000 | 1,000 (1,000 · 1,000) |  |  | " in text  # no ratio, no floor
    assert "| 0.900 (0.900 · 0.900) | not measured |" in gpu_tables([ref, other])
    # whole processes: a run repeated in its job against its first is the floor of their ratios
    again = whole("stock_fairseq_train_fp16", 13500.0, repeat=2, **later, wps_median_later_epochs=42000.0,
                  wps_intervals_later_epochs=6)
    text = gpu_tables([whole("stock_fairseq_train_fp16", 15000.0, **later, wps_median_later_epochs=40000.0,
                             wps_intervals_later_epochs=6), again])
    assert "| stock_fairseq_train_fp16 (repeat 2) | fp16 | 13,500 (6,750-27,000) | 0.90 |" in text
    assert "the ratios (a run repeated in its job against its first): ±11.1 % in the median wps, ±5.0 %" in text
    assert "Noise floor of the ratios: not measured (no run repeated in its job)" in gpu_tables(
        [whole("stock_fairseq_train_fp16", 15000.0)])
    # the whole processes in interleaved rounds: per run the summary with the most rounds of the
    # newest job, its ratio to stock round by round, the noise floor beside it, MFU with its peak
    def summary(run, rounds, wps, **extra):
        return {"benchmark": "gpu_train", "kind": "whole_summary", "run": run, "device": "GPU X", "job": "j",
                "precision": "bf16", "tokens": 4096, "rounds": rounds, "wps_steady": wps,
                "wps_steady_rounds": [wps] * rounds, "noise_floor": 0.05, **extra}

    fast = dict(reference="stock_fairseq_train_fp16", target=">= 3x stock fairseq train fp16", meets=False)
    text = gpu_tables([summary("resnmt_train_fast_bf16", 1, 90000.0, ratio=2.0, ratio_rounds=[2.0], **fast),
                       summary("resnmt_train_fast_bf16", 2, 90000.0, ratio=2.5, ratio_rounds=[2.0, 3.0],
                               mfu_6nd=0.1, peak_dtype="bf16", **fast)])
    assert "**GPU X, whole processes in interleaved rounds** (4096 tokens per update;" in text
    assert ("| resnmt_train_fast_bf16 | bf16 | 2 | 90,000 (90,000 · 90,000) | 2.500 (2.000 · 3.000) | ±5.0 % | "
            "stock_fairseq_train_fp16 | >= 3x stock fairseq train fp16 | False |  | 10.0 % (of the bf16 peak) |") in text


def test_a_same_math_pair_resolves_only_over_four_rounds_above_its_noise_floor():
    """The honest harness: a ratio from one round (spread 0 by construction) never
    resolves; four rounds whose ratios, spread and the job's noise floor all stay under 2 %
    do; a noise floor not measured, or of 2 % or more, keeps any pair from resolving."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from rows import TRAINER_ROWS
    from verdicts import pair_resolution, trainer_verdict

    one = {"ratio": 1.122, "ratio_min": 1.122, "ratio_max": 1.122, "spread": 0.0, "rounds": 1}
    assert pair_resolution(one, 0.001) == ["1 round (4 needed)"]
    assert trainer_verdict(TRAINER_ROWS["post_ln"], one, 0.001) == {"target": "0.98-1.02", "meets": False,
                                                                     "resolves": False}
    four = {"ratio": 1.004, "ratio_min": 0.999, "ratio_max": 1.012, "spread": 0.015, "rounds": 4,
            "ratio_q1": 1.0, "ratio_q3": 1.01}
    assert pair_resolution(four, 0.008) == [] and trainer_verdict(TRAINER_ROWS["post_ln"], four, 0.008)["resolves"]
    assert pair_resolution(four, None) == ["no noise floor: no two identical configurations in the job"]
    assert pair_resolution(four, 0.125) == ["identical configurations in the job differed by up to 12.5 %"]
    assert pair_resolution(dict(four, spread=0.03), 0.008) == ["its tokens/s spread 3.0 % over the rounds"]
    wide = dict(four, ratio_max=1.05)
    assert pair_resolution(wide, 0.008) == ["rows within 5.1 % of each other cannot be separated; the middle half "
                                            "of the 4 rounds lies within 1.000-1.010"]


def test_every_job_measures_its_noise_floor():
    """Where no two configurations of a token setting share a command line, the first is
    measured again (its twin, listed last); where two do (stock fp16 is the transformer row
    in fp16, which the CPU runs in fp32), no twin is added."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import gpu_train
    import trainer_rounds

    def configs(*argv):
        a, rows, dtypes, tokens, limits = gpu_train.parse(["--data", "x", "--out", "y", "--cpu", *argv])
        return [c.key for c in trainer_rounds.configs_at(a, tokens[0], rows, dtypes, limits)]

    assert configs("--rows", "transformer,post_ln", "--no-recipe") == ["transformer/fp32", "post_ln/fp32",
                                                                       "transformer_twin/fp32"]
    assert configs("--rows", "transformer,post_ln", "--recipes", "recipe") == [  # stock fp16 is fp32 on the CPU
        "transformer/fp32", "post_ln/fp32", "stock_fp16/fp32", "recipe/fp32"]
    a = gpu_train.parser().parse_args(["--data", "x", "--out", "y", "--rows", "post_ln", "--recipes", "recipe"])
    gpu = trainer_rounds.configs_at(a, 4096, ["post_ln"], ["bf16"], {})
    assert [c.key for c in gpu] == ["post_ln/bf16", "stock_fp16/fp16", "recipe/bf16", "post_ln_twin/bf16"]
    assert gpu[-1].twin_of == "post_ln/bf16" and trainer_rounds.reference_key(gpu[-1], gpu) == "post_ln/bf16"


@pytest.mark.parametrize("args, message", [
    (["--rows", "post_ln,nope"], "--rows nope: unknown; choose from transformer, post_ln"),
    (["--dtypes", "fp8"], "--dtypes fp8: choose from fp16, bf16"),
    (["--whole-runs", "stock_fairseq_train_fp16,stock_bf16"], "--whole-runs stock_bf16: unknown; choose from "
                                                               "stock_fairseq_train_fp16, resnmt_postln_fp16"),
])
def test_bad_input_is_one_line(tiny_bin, tmp_path, args, message):
    proc = run_cli([sys.executable, SCRIPT, "--smoke", "--cpu", "--data", tiny_bin, "--out", tmp_path / "x.jsonl", *args],
                   check=False)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1]


def test_without_a_gpu_it_says_so(tiny_bin, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    proc = run_cli([sys.executable, SCRIPT, "--data", tiny_bin, "--out", tmp_path / "x.jsonl"], check=False)
    assert proc.returncode == 2 and "no CUDA device here" in proc.stderr.strip().splitlines()[-1]


def test_a_failing_configuration_is_recorded_and_the_others_measured(tiny_bin, tmp_path, monkeypatch):
    """(in-process) e.g. a compiler error in one row: an error record, the other rows measured."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import gpu_train
    import trainer_rounds

    real = trainer_rounds.count_flops

    def count_flops(trainer, sample):
        if type(trainer.model).__name__ == "ResidualTransformerModel":
            raise RuntimeError("planted failure")
        return real(trainer, sample)

    monkeypatch.setattr(trainer_rounds, "count_flops", count_flops)
    out = tmp_path / "rows.jsonl"
    gpu_train.main(["--smoke", "--cpu", "--data", str(tiny_bin), "--out", str(out), "--rows", "transformer,post_ln",
                    "--no-recipe", "--tokens", "600", "--warmup", "1", "--updates", "1", "--rounds", "1",
                    "--batches", "2"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    errors = [r for r in records if r["kind"] == "error"]
    assert [(e["config"], e["stage"]) for e in errors] == [("post_ln/fp32", "build and warm-up")]
    assert "RuntimeError: planted failure" in errors[0]["error"]
    rows = [r for r in records if r["kind"] == "row"]
    # (and transformer's twin, the noise floor: no two configurations of this job were the same)
    assert [r["config"] for r in rows] == ["transformer", "transformer_twin"] and rows[0]["warmup_s"] > 0
    assert rows[1]["reference"] == "transformer/fp32" and rows[1]["noise_floor"] == pytest.approx(
        max(max(r, 1 / r) for r in rows[1]["ratio_rounds"]) - 1)


def test_the_gpu_job_measures_every_named_arch():
    """The GPU job stays current: every resnmt `*_base` arch has a row in gpu_train.py, and
    gpu_job.sh's part 4 measures exactly the rows left out of the default table, with the
    references they are compared to."""
    import re

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import rows
    from fairseq.models import ARCH_MODEL_REGISTRY

    import resnmt  # noqa: F401  (registers the archs)

    named = {a for a, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("resnmt") and a.endswith("_base")}
    measured = {rows.CONFIGS[r.config][0] for r in rows.TRAINER_ROWS.values()}
    assert named and named <= measured, named - measured
    job = (REPO_ROOT / "benchmarks" / "gpu_job.sh").read_text()
    part4 = set(re.search(r'elif \[ "\$PART" = 4 \].*?--rows (\S+)', job, re.S).group(1).split(","))
    extra = set(rows.CROSS_LAYER_ROWS)
    references = {rows.TRAINER_ROWS[r].reference for r in extra}
    assert part4 == extra | references | {rows.TRAINER_ROWS[r].reference for r in references
                                          if rows.TRAINER_ROWS[r].reference}


def test_the_cuda_graph_recipe_and_its_rehearsal():
    """recipe_graphs adds CUDA graphs (--compile-mode reduce-overhead) and bucketed lengths to
    the compiled recipe on a GPU; the CPU rehearsal's eager backend takes no mode, so it drops
    it there (resnmt would refuse the pair), and the GPU job's part 3 measures it."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import rows
    import trainer_rounds

    row, recipe = rows.TRAINER_ROWS["post_ln"], rows.RECIPES["recipe_graphs"]
    gpu = trainer_rounds.train_argv("bin", row, "bf16", 4096, recipe, smoke=False, cpu=False)
    tail = gpu[gpu.index("adam_fused") - 1:]
    assert tail == ["--optimizer", "adam_fused", "--task", "resnmt_translation", "--compile-layers", "--compile-mode",
                    "reduce-overhead", "--required-seq-len-multiple", "8", "--compile-backend", "inductor"]
    rehearsal = trainer_rounds.train_argv("bin", row, "fp32", 600, recipe, smoke=True, cpu=True, compile_backend="eager")
    assert "--compile-mode" not in rehearsal and rehearsal[-3:] == ["--compile-backend", "eager", "--cpu"]
    assert "--required-seq-len-multiple" in rehearsal
    job = (REPO_ROOT / "benchmarks" / "gpu_job.sh").read_text()
    assert "--recipes recipe_compiled,recipe_graphs" in job


def test_the_flash_attention_and_fused_sync_recipes():
    """recipe_flash: the recipe with attention restricted to FlashAttention and the
    memory-efficient kernel (no cuDNN plans per batch shape), as a trainer row and a whole
    process, which part 2 of the GPU job runs; recipe_fused: the recipe with the master
    weights' copies in multi-tensor kernels, which part 1 times and profiles."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import rows
    import trainer_rounds

    argv = trainer_rounds.train_argv("bin", rows.TRAINER_ROWS["post_ln"], "bf16", 4096, rows.RECIPES["recipe_flash"],
                                     smoke=False, cpu=False)
    assert argv[argv.index("adam_fused") - 1:] == ["--optimizer", "adam_fused", "--task", "resnmt_translation",
                                                   "--sdpa-backends", "flash,efficient,math"]
    job = (REPO_ROOT / "benchmarks" / "gpu_job.sh").read_text()
    assert "resnmt_train_recipe_flash_bf16" in job and "resnmt_train_recipe_flash_bf16" in rows.WHOLE_RUN_NAMES
    fused = trainer_rounds.train_argv("bin", rows.TRAINER_ROWS["post_ln"], "bf16", 4096, rows.RECIPES["recipe_fused"],
                                      smoke=False, cpu=False)
    assert fused[fused.index("adam_fused") - 1:] == ["--optimizer", "adam_fused", "--task", "resnmt_translation",
                                                     "--fused-master-weights"]
    assert "--recipes recipe,recipe_fused --profile" in job  # part 1 times and profiles it


def test_process_wide_switches_follow_each_configuration(tiny_bin):
    """--sdpa-backends and --fused-master-weights switch the whole process; configurations
    share it, so before each one runs the switches are set as its own command line sets
    them (and put back for the ones without)."""
    from types import SimpleNamespace

    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import rows
    import trainer_rounds
    from resnmt.training import master_sync
    from resnmt.training.attention import sdpa_backends_enabled, use_sdpa_backends

    def config(recipe):
        """The configuration with its command line parsed as fairseq-train parses it."""
        argv = trainer_rounds.train_argv(tiny_bin, rows.TRAINER_ROWS["post_ln"], "bf16", 600, rows.RECIPES[recipe],
                                         smoke=True, cpu=True)
        cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
        return trainer_rounds.Config(recipe, "post_ln", "bf16", recipe=rows.RECIPES[recipe],
                                     trainer=SimpleNamespace(task=SimpleNamespace(cfg=cfg.task)))

    default = sdpa_backends_enabled()
    try:
        plain, flash, fused = (config(n) for n in ("recipe", "recipe_flash", "recipe_fused"))
        trainer_rounds.process_wide(flash, default)
        assert sdpa_backends_enabled() == ("flash", "efficient", "math") and not master_sync.installed()
        trainer_rounds.process_wide(fused, default)
        assert sdpa_backends_enabled() == default and master_sync.installed()
        trainer_rounds.process_wide(plain, default)
        assert sdpa_backends_enabled() == default and not master_sync.installed()
    finally:
        use_sdpa_backends(default)
        master_sync.uninstall()


def test_plot_of_the_whole_processes(tmp_path):
    """plot_gpu.py draws each device's newest job of whole processes (an older job and a
    failed run are left out), one figure per device."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import plot_gpu

    def whole(run, job, device="GPU X", **extra):
        intervals = [{"num_updates": u, "wps": 1000.0 * u, "epoch": 1.0 if u < 30 else 2.0} for u in (10, 20, 30, 40)]
        return {"benchmark": "gpu_train", "kind": "whole_process", "run": run, "device": device, "job": job,
                "precision": "fp16", "argv": ["--max-tokens", "4096"], "intervals": intervals, **extra}

    records = [whole("stock_fairseq_train_fp16", "2026-01-01"), whole("stock_fairseq_train_fp16", "2026-02-01"),
               whole("resnmt_postln_fp16", "2026-02-01"), whole("resnmt_postln_fp16", "2026-02-01", error="x"),
               whole("stock_fairseq_train_fp16", "2026-01-01", device="GPU Y")]
    newest = plot_gpu.newest_whole_processes(records)
    assert {d: [(r["run"], r["job"]) for r in rs] for d, rs in newest.items()} == {
        "GPU X": [("stock_fairseq_train_fp16", "2026-02-01"), ("resnmt_postln_fp16", "2026-02-01")],
        "GPU Y": [("stock_fairseq_train_fp16", "2026-01-01")]}
    results = tmp_path / "gpu_train.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert plot_gpu.main(["--results", str(results), "--out-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["gpu-whole-process-gpu-x.png", "gpu-whole-process-gpu-y.png"]


def test_a_fast_path_log_says_what_was_recorded_before_training_and_what_runs_eagerly():
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import whole_processes

    text = ("[fast path] the update on the cuda (bf16 model, float32 master weights), each step captured once per "
            "batch shape as a CUDA graph\n"
            "[fast path] Adam: one Triton kernel launch over every parameter\n"
            "[fast path] the fused Adam kernel failed (RuntimeError: PTX JIT compilation failed); Adam runs as "
            "multi-tensor operations\n"
            "[fast path] loss: one Triton kernel from the logits (no float32 log-probabilities)\n"
            "[fast path] the fused cross-entropy kernel failed (RuntimeError: out of resources); the loss runs as "
            "fairseq's criterion\n"
            "[fast path] captured forward_backward 8 8x33 8 8x40 8x40 as a CUDA graph in 0.52 s (graph 1)\n"
            "[fast path] forward_backward 16 16x20 16 16x21 16x21: its capture failed (RuntimeError: operation not "
            "permitted when stream is capturing); this shape runs eagerly from now on\n"
            "[fast path] captured update as a CUDA graph in 0.10 s (graph 2)\n"
            "[fast path] 2 shapes and the update recorded before training in 3.4 s (2 graphs, 1 shapes eager)\n")
    rec = whole_processes.fast_path_log(text, [{"num_updates": 10, "graphs": 2.0}, {"num_updates": 20, "graphs": 2.0}])
    assert rec["graphs"] == 2 and rec["capture_s"] == pytest.approx(0.62) and rec["last_update_with_a_new_graph"] is None
    assert rec["recorded_before_training_s"] == 3.4
    assert rec["adam"] == ("one Triton kernel launch over every parameter; the Triton kernel failed (RuntimeError: PTX "
                           "JIT compilation failed)")
    assert rec["loss"] == ("one Triton kernel from the logits (no float32 log-probabilities); the Triton kernel failed "
                           "(RuntimeError: out of resources)")
    assert rec["eager_shapes"] == ["forward_backward 16 16x20 16 16x21 16x21: its capture failed (RuntimeError: "
                                   "operation not permitted when stream is capturing)"]


def test_the_profile_counts_kernels_once_and_keeps_ranges_apart():
    """record_function ranges report their whole GPU span: kept apart from the kernels' sum."""
    from types import SimpleNamespace

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from fairseq_trainer import kernels_and_ranges

    def event(key, us, annotation=False):
        return SimpleNamespace(key=key, self_device_time_total=us, is_user_annotation=annotation)

    events = [event("forward", 19300, True), event("sm90_gemm", 4000), event("aten::mm", 4000),
              event("elementwise_kernel", 6000), event("Optimizer.step#Adam.step", 800, True), event("cpu op", 0)]
    kernels, ranges = kernels_and_ranges(events)
    assert [e.key for e in kernels] == ["elementwise_kernel", "sm90_gemm"]
    assert [e.key for e in ranges] == ["forward", "Optimizer.step#Adam.step"]
