"""Smoke test of benchmarks/ (speed.py, quality.py, curves.py, malloc.py, make_tables.py) and of the study's
protocol (resnmt.study) and campaign (benchmarks/campaign, benchmarks/curves.py) with tiny settings.

The real benchmark numbers come from `make bench` (docs/benchmarks.md); this only checks
that the scripts run end to end and write what make_tables.py reads.
"""
import json
import math
import re
import sys

import pytest

from conftest import REPO_ROOT, run_cli

from resnmt.study import milestones

BENCH = REPO_ROOT / "benchmarks"


def finite_positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_speed_tiny(tiny_bin, tmp_path):
    out = tmp_path / "speed.jsonl"
    proc = run_cli([
        sys.executable, BENCH / "speed.py", "--data", tiny_bin, "--size", "tiny", "--rounds", "1",
        "--warmup", "1", "--updates", "1", "--max-tokens", "300", "--decode-sentences", "4",
        "--decode-batch", "4", "--decode-len", "3", "--rows", "sas (gate 64)", "--out", out,
    ], timeout=300)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["row"] for r in records] == ["sas (gate 64)"]
    for r in records:
        assert r["reference"] == "transformer" and r["rounds"] == 1
        for key in ("train_ratio", "decode_ratio", "memory_ratio"):
            assert finite_positive(r[key]["median"]), (r["row"], key, r[key])
    sas = records[0]["sas_overhead"]
    assert sas["gate_dim"] == 64 and 0 < sas["predicted_train_ratio"] < 1
    assert finite_positive(sas["measured_over_predicted"])
    assert "| sas (gate 64) (vs transformer) |" in proc.stdout


def test_speed_worker_measures_a_round_in_one_process(tiny_bin):
    """The GPU driver's mode (one process per round): each config is built and measured on
    its own within the process, in the order given."""
    spec = {"data": str(tiny_bin), "device": "cpu", "size": [1, 16, 32, 2], "threads": 1, "warmup": 1,
            "updates": 1, "max_tokens": 300, "dtype": "fp32", "decode_sentences": 4, "decode_batch": 4,
            "decode_len": 3}
    proc = run_cli([sys.executable, BENCH / "speed_measure.py",
                    json.dumps([dict(spec, config="transformer"), dict(spec, config="sas_gate64")])], timeout=300)
    first, second = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (first["config"], second["config"]) == ("transformer", "sas_gate64")
    assert second["params"] > first["params"] and finite_positive(second["train_tokens_per_s"])


def test_speed_half_precision_is_gpu_only(tiny_bin, tmp_path):
    proc = run_cli([sys.executable, BENCH / "speed.py", "--data", tiny_bin, "--dtype", "bf16",
                    "--out", tmp_path / "s.jsonl"], check=False)
    assert proc.returncode == 2 and "--dtype bf16: half precision is measured on a GPU only" in proc.stderr
    assert not (tmp_path / "s.jsonl").exists()


def test_fp16_bf16_stops_before_any_run_where_fairseq_cannot_train_it(tiny_bin, tmp_path):
    """fairseq 0.12's --bf16 implies --tpu: without torch_xla no run could start."""
    import importlib.util

    if importlib.util.find_spec("torch_xla") is not None:
        pytest.skip("torch_xla is installed: fairseq's --bf16 can run here")
    proc = run_cli([sys.executable, BENCH / "fp16.py", "--bf16", "--data", tiny_bin.parent, "--workdir", tmp_path / "w",
                    "--out", tmp_path / "fp16.jsonl"], check=False)
    assert proc.returncode == 2 and "--bf16: fairseq 0.12 trains in bf16 on TPUs only" in proc.stderr
    assert not (tmp_path / "w").exists() and not (tmp_path / "fp16.jsonl").exists()


def test_speed_half_precision_optimizer_keeps_float32_masters():
    """fairseq's --fp16 scheme: Adam steps float32 copies; the half weights are their casts."""
    import torch

    sys.path.insert(0, str(BENCH))
    from eager_training import FP16_LOSS_SCALE, Optimizer

    torch.manual_seed(0)
    for dtype, scale in ((torch.bfloat16, 1.0), (torch.float16, FP16_LOSS_SCALE)):
        model = torch.nn.Linear(4, 3).to(dtype)
        ref = torch.nn.Linear(4, 3)
        ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
        opt, ref_opt = Optimizer(model, dtype), torch.optim.Adam(ref.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-8)
        assert opt.loss_scale == scale
        x = torch.randn(5, 4)
        opt.zero_grad()
        opt.backward(model(x.to(dtype)).float().square().mean())
        # the reference sees the gradient the half model computed, unscaled
        for p, r in zip(model.parameters(), ref.parameters()):
            r.grad = p.grad.float() / scale
        opt.step()
        ref_opt.step()
        for p, m, r in zip(model.parameters(), opt.masters, ref.parameters()):
            assert m.dtype == torch.float32 and torch.allclose(m, r, atol=1e-7)
            assert p.dtype == dtype and torch.equal(p, m.to(dtype))
    # fp16: an update whose gradients overflow is skipped and the scale halved (fairseq's scaler)
    before = [p.clone() for p in model.parameters()]
    opt.zero_grad()
    opt.backward(model(torch.full((5, 4), 60000.0).to(dtype)).float().square().mean())
    opt.step()
    assert opt.overflows == 1 and opt.loss_scale == FP16_LOSS_SCALE / 2
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_plot_curves_leaves_single_budgets_out_of_the_figures(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from plot_curves import with_curves

    runs = {("cpu", "small"): {"post_ln": {1: {600: {}, 1200: {}}}},
            ("cuda", "base"): {"post_ln": {1: {600: {}}}, "sas": {1: {600: {}}}},
            ("cuda", "small"): {"post_ln": {1: {600: {}}}, "sas": {2: {1200: {}}}}}
    assert sorted(with_curves(runs)) == [("cpu", "small"), ("cuda", "small")]


def test_fp16_check_reads_fairseq_logs_and_compares_with_post_ln():
    sys.path.insert(0, str(BENCH))
    from verdicts import fp16_log_record, fp16_verdicts

    from resnmt.experiment.steps import FairseqLog

    log = "\n".join([
        "2026-11-24 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, "
        "setting loss scale to: 64.0",
        "2026-11-24 | INFO | train_inner | epoch 001:     50 / 147 loss=12.1, nll_loss=12, ppl=4096, wps=1e+05, "
        "ups=9.1, wpb=3800, bsz=120, num_updates=50, lr=1.6e-4, gnorm=3.2, loss_scale=64, train_wall=5, wall=8",
        "2026-11-24 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, "
        "setting loss scale to: 32.0",
        "2026-11-24 | INFO | train_inner | epoch 001:    100 / 147 loss=9.5, nll_loss=9.2, ppl=600, wps=1e+05, "
        "ups=9.1, wpb=3800, bsz=120, num_updates=100, lr=3.3e-4, gnorm=2.1, loss_scale=32, train_wall=10, wall=14",
    ])
    rec = fp16_log_record(FairseqLog.parse(log))
    assert rec == {"overflows": 2, "loss_scale": 32.0, "train_loss": 9.5, "updates_logged": 100,
                   "min_scale_reached": False}
    base = dict(rec, row="post_ln", exit_code=0)
    worse = dict(rec, row="sas", exit_code=0, overflows=3)
    diverged = dict(rec, row="admin", exit_code=0, train_loss=float("nan"))
    stopped = dict(fp16_log_record(FairseqLog.parse(log + "\nFloatingPointError: Minimum loss scale reached (0.0001).")),
                   row="rezero", exit_code=1)
    verdict = {r["row"]: r["passed"] for r in fp16_verdicts([base, worse, diverged, stopped])}
    assert verdict == {"post_ln": True, "sas": False, "admin": False, "rezero": False}
    from result_tables import fp16_table

    assert "| sas | 3 (2) | 32.0 | 9.5 @ 100 | 0 | FAIL |" in fp16_table([base, worse])


def test_fp16_headroom_takes_fairseq_trains_first_step(tiny_bin, tmp_path):
    """--headroom's step is fairseq-train's first update: same loss and gradient norm (as
    logged, base 2 per token), so its largest gradient is the one fp16 would have to hold."""
    sys.path.insert(0, str(BENCH))
    import headroom

    from resnmt.experiment.presets import SIZES
    from resnmt.study.runs import benchmark_train_argv

    argv = benchmark_train_argv(tiny_bin, "transformer_rezero_base", [], SIZES["tiny"], seed=3,
                                max_tokens=300, lr=1e-3, warmup=300, dropout=0.1, save_every=1, keep=1,
                                validate=False)
    log = run_cli([*argv, "--max-update", "1", "--log-interval", "1", "--save-dir", tmp_path / "run"],
                  timeout=300).stdout
    first = next(line for line in log.splitlines() if "| train_inner |" in line)
    logged = {key: re.search(rf"[ |]{key}=([^,\s]+)", first).group(1) for key in ("loss", "gnorm")}
    step = headroom.first_step(argv)
    # fairseq logs each value rounded to 3 decimals (12.140 as 12.14)
    assert (round(step["loss"], 3), round(step["grad_norm"], 3)) == (float(logged["loss"]), float(logged["gnorm"]))
    assert step["updates"] == 0 and step["max_fp16_loss_scale"] == pytest.approx(65504 / step["largest_grad"])
    # fairseq's first update runs at the warm-up's initial learning rate, 0: the checkpoint
    # after it holds the initial weights, and measuring it gives the same step again
    trained = headroom.first_step(None, tmp_path / "run" / "checkpoint_last.pt", data=tiny_bin)
    assert trained["updates"] == 1
    assert {k: trained[k] for k in ("loss", "grad_norm", "largest_grad")} == {
        k: step[k] for k in ("loss", "grad_norm", "largest_grad")}

    out = tmp_path / "fp16.jsonl"
    proc = run_cli([sys.executable, BENCH / "fp16.py", "--headroom", "--data", tiny_bin.parent, "--size", "tiny",
                    "--max-tokens", "300", "--rows", "rezero", "--out", out], timeout=300)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["row"] for r in records] == ["post_ln", "rezero"]  # post-LN, the baseline, always comes along
    assert all(r["benchmark"] == "fp16-headroom" and r["settings"]["at"] == "initialization" for r in records)
    assert "| rezero | " in proc.stdout
    missing = run_cli([sys.executable, BENCH / "fp16.py", "--headroom", "--data", tiny_bin.parent,
                       "--checkpoint", tmp_path / "nope.pt"], check=False)
    assert missing.returncode == 2 and "nope.pt: no such file" in missing.stderr


def test_malloc_tiny_same_loss_in_both_environments(tiny_bin, tmp_path):
    out = tmp_path / "malloc.jsonl"
    proc = run_cli([sys.executable, BENCH / "malloc.py", "--data", tiny_bin, "--size", "tiny", "--updates", "8",
                    "--max-tokens", "300", "--rounds", "1", "--out", out], timeout=300)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["condition"] for r in records] == ["glibc default", "keep freed memory"]
    assert len({r["final_train_loss"] for r in records}) == 1 and records[0]["final_train_loss"] > 0
    for r in records:
        assert finite_positive(r["wall_seconds"]) and finite_positive(r["peak_rss_mib"]), r
    assert "| keep freed memory |" in proc.stdout and "the same in every process" in proc.stdout
    bad = run_cli([sys.executable, BENCH / "malloc.py", "--data", tiny_bin, "--rounds", "0"], check=False)
    assert bad.returncode == 2 and bad.stderr.splitlines()[-1] == (
        "malloc.py: error: argument --rounds: invalid value '0': must be an integer >= 1")


def test_quality_tiny_and_resume(tiny_bin, tmp_path, monkeypatch, capsys):
    out = tmp_path / "quality.jsonl"
    argv = [
        sys.executable, BENCH / "quality.py", "--data", tiny_bin.parent, "--ref", tiny_bin.parent / "text" / "test.de",
        "--remove-bpe", "none", "--size", "tiny", "--max-update", "2", "--save-every", "1", "--average", "2",
        "--warmup", "1", "--max-len-b", "5", "--rows", "post_ln", "--seeds", "1",
        "--workdir", tmp_path / "work", "--out", out,
    ]
    run_cli(argv, timeout=300)
    (rec,) = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rec["row"] == "post_ln" and rec["seed"] == 1 and rec["n_sentences"] == 60
    assert math.isfinite(rec["bleu"]) and rec["bleu"] >= 0
    # no machine's folders in the record: the corpus outside the repository, led by its name
    corpus = tiny_bin.parent.name
    assert (rec["data"], rec["ref"]) == (f"{corpus}/bin", f"{corpus}/text/test.de")
    # the command ran above; its --list and its re-run in this process (each a file read)
    monkeypatch.syspath_prepend(str(BENCH))
    import quality

    capsys.readouterr()
    assert quality.main([str(a) for a in [*argv[2:], "--list"]]) == 0
    assert "done     post_ln  seed 1" in capsys.readouterr().out
    assert quality.main([str(a) for a in argv[2:]]) == 0  # resumable: a finished (row, seed, settings) is not run again
    assert len(out.read_text(encoding="utf-8").splitlines()) == 1


def test_make_tables_from_handwritten_jsonl(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    settings = {
        "size": {"name": "small", "layers": 2, "dim": 128, "ffn": 512, "heads": 4}, "max_tokens": 4096,
        "max_update": 800, "lr": 0.001, "warmup_updates": 300, "dropout": 0.1, "label_smoothing": 0.1,
        "save_every": 40, "average": 5, "beam": 4, "lenpen": 0.6, "lenpen_form": "gnmt", "threads": 1,
    }
    lines = [
        {"benchmark": "quality", "row": "post_ln", "seed": s, "settings": settings, "settings_key": "k1", "bleu": b}
        for s, b in ((1, 30.0), (2, 32.0))
    ] + [{"benchmark": "quality", "row": "sas", "seed": 1, "settings": settings, "settings_key": "k1", "bleu": 29.5},
         # another budget: kept out of the k1 rows (k1 has more runs), counted in a note
         {"benchmark": "quality", "row": "post_ln", "seed": 1, "settings": dict(settings, max_update=10),
          "settings_key": "k0", "bleu": 3.0}]
    (results / "quality.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- speed-table:begin -->\nold\n<!-- speed-table:end -->\nmiddle\n"
                   "<!-- quality-table:begin -->\nold\n<!-- quality-table:end -->\nend\n", encoding="utf-8")
    run_cli([sys.executable, BENCH / "make_tables.py", "--results", results, "--write", doc])
    text = doc.read_text(encoding="utf-8")
    assert "| post_ln | 2 | 31.00 | 1.41 | 30.00–32.00 | 1,2 |" in text
    assert "| sas | 1 | 29.50 | — |" in text
    assert "transformer (0 of 2 seeds)" in text and "old" not in text
    assert "3.00" not in text and "other settings" in text and "k0 (1 run)" in text
    assert text.startswith("intro\n") and text.endswith("end\n") and "_no speed results yet_" in text


@pytest.mark.slow  # the lab's campaign runner end to end (40 s); the protocol resuming: test_install's verdict run twice
def test_curves_tiny_milestones_resume_and_plots(tiny_bin, tmp_path, monkeypatch, capsys):
    """One run scored at two budgets (a job of submitit's local executor); re-running (in this
    process) scores nothing again; the plots read it."""
    out = tmp_path / "curves.jsonl"
    argv = [
        sys.executable, BENCH / "curves.py", "--data", tiny_bin.parent, "--ref", tiny_bin.parent / "text" / "test.de",
        "--remove-bpe", "none", "--tiny", "--milestones", "2,4", "--save-every", "1", "--average", "2",
        "--warmup", "1", "--max-tokens", "300", "--analyze-sentences", "8", "--only", "small:post_ln:1", "--threads", "1",
        "--workdir", tmp_path / "work", "--out", out,
    ]
    first = run_cli([*argv, "--executor", "local"], timeout=300)  # the run a job of submitit's local executor
    assert "[curves] small post_ln 1: job " in first.stderr and first.stderr.rstrip().endswith(" done")
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["row"], r["seed"], r["updates"]) for r in records] == [("post_ln", 1, 2), ("post_ln", 1, 4)]
    for r in records:
        assert math.isfinite(r["bleu"]) and r["n_sentences"] == 60 and r["device"] == "cpu"
        assert r["size"]["layers"] == 2 and r["settings"]["dropout"] == 0.3  # SIZES["tiny"]
        assert "threads" not in r["settings"] and r["torch_threads"] == 1  # execution, not a setting
        assert r["schedule"] == {"lr_scheduler": "inverse_sqrt", "lr": 1e-3, "warmup_updates": 1}
        assert r["execution_flags"] == []
        assert len(r["analysis"]["statistics"]["grad_norm"]["encoder"]["output"]) == r["size"]["layers"]
        assert len(r["averaged"]) == 2
        assert (r["data"], r["ref"]) == (f"{tiny_bin.parent.name}/bin", f"{tiny_bin.parent.name}/text/test.de")
    assert records[1]["train_seconds"] >= records[0]["train_seconds"] > 0
    run_cli(argv)
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    # --list and a refused option in this process (the command ran above)
    monkeypatch.syspath_prepend(str(BENCH))
    from campaign import curves

    capsys.readouterr()
    assert curves.main([str(a) for a in [*argv[2:], "--list"]]) == 0
    assert "partial" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        curves.main([str(a) for a in [*argv[2:-2], "--milestones", "1", "--out", out]])
    assert bad.value.code == 2 and "--milestones 1" in capsys.readouterr().err
    figures = tmp_path / "figures"
    run_cli([sys.executable, BENCH / "plot_curves.py", "--results", out, "--figures", figures])
    table = run_cli([sys.executable, BENCH / "make_tables.py", "--results", tmp_path]).stdout
    assert "| post_ln |" in table
    assert sorted(p.name for p in figures.iterdir()) == ["curves-bleu-difference.png", "curves-bleu.png",
                                                          "curves-diagnostics.png", "curves-gradient-share.png",
                                                          "curves-valid-loss.png"]


def default_settings_key(curves) -> str:
    """The settings key of curves.py's default settings (what its --list reads lines by)."""
    from resnmt.study import records

    return records.settings_key(milestones.study_settings(curves.parser().parse_args([])))


def test_curves_keeps_gpu_runs_apart_from_cpu_runs(tmp_path, monkeypatch, capsys):
    """A CPU line does not mark the GPU run done; the base size is planned on a GPU only."""
    monkeypatch.syspath_prepend(str(BENCH))
    from campaign import curves

    out = tmp_path / "curves.jsonl"

    def listed(*flags):
        assert curves.main(["--out", str(out), "--list", *flags]) == 0
        return capsys.readouterr().out

    assert "missing  small post_ln " in listed() and " base " not in listed()
    line = {"benchmark": "curves", "settings_key": default_settings_key(curves), "size": {"name": "small"},
            "row": "post_ln", "seed": 1, "updates": 200, "device": "cpu"}
    out.write_text(json.dumps(line) + "\n", encoding="utf-8")
    assert "partial  small post_ln " in listed()
    gpu = listed("--device", "cuda")
    assert "missing  small post_ln " in gpu and "missing  base  post_ln " in gpu
    with pytest.raises(SystemExit) as stop:
        curves.main(["--out", str(out), "--only", "base:post_ln:1"])
    assert stop.value.code == 2
    assert "--only base:post_ln:1: the base/base12 sizes run only with --device cuda" in capsys.readouterr().err


GPU_SCHEDULE = ["--lr", "7e-4", "--warmup", "2000", "--save-every", "100"]


def test_curves_gpu_study_plans_the_papers_sizes_under_its_own_schedule(tmp_path, monkeypatch, capsys):
    """The GPU study (gpu_job.sh part 7) plans base and 12+12 in priority order; its schedule
    gives another settings key, so the GPU lines of the CPU study's schedule do not mark its
    runs done, and the tables keep them in a setting of their own."""
    monkeypatch.syspath_prepend(str(BENCH))
    from campaign import curves
    from campaign import plan as study
    from campaign import tables as study_tables

    out = tmp_path / "curves.jsonl"
    gpu = ["--out", str(out), "--device", "cuda", "--sizes", "base,base12", *GPU_SCHEDULE]
    assert curves.main([*gpu, "--list"]) == 0
    listed = [re.match(r"(\w+) +(\w+) +(.+?) +seed (\d)", line).groups() for line in capsys.readouterr().out.splitlines()]
    assert [(size, row, int(seed)) for _, size, row, seed in listed] == list(study.PAPERS_SIZE_ORDER)
    assert ("base12", "post_ln", 1) in study.PAPERS_SIZE_ORDER and ("base", "sas", 1) in study.PAPERS_SIZE_ORDER
    assert {state for state, *_ in listed} == {"missing"}

    settings = milestones.study_settings(curves.parser().parse_args(GPU_SCHEDULE))
    cpu_key = default_settings_key(curves)
    assert milestones.schedule_of(settings) == {"lr_scheduler": "inverse_sqrt", "lr": 7e-4, "warmup_updates": 2000}
    keys = {records_key(curves, ["--lr", str(lr), "--warmup", str(w), "--save-every", "100"])
            for lr, w in (*study.SWEEP_SCHEDULES, study.FALLBACK_SCHEDULE)}
    assert len(keys) == len(study.SWEEP_SCHEDULES) + 1 and cpu_key not in keys
    old = {"benchmark": "curves", "settings_key": cpu_key, "size": {"name": "base"}, "row": "post_ln", "seed": 1,
           "updates": 1000, "device": "cuda", "settings": {"lr": 1e-3, "warmup_updates": 300}}
    new = dict(old, settings_key=records_key(curves, GPU_SCHEDULE), settings=settings)
    out.write_text(json.dumps(old) + "\n", encoding="utf-8")
    assert curves.main([*gpu, "--list", "--only", "base:post_ln:1"]) == 0
    assert capsys.readouterr().out.startswith("missing  base  post_ln")
    assert set(study_tables.runs_of([old, new])) == {("cuda", "base"), ("cuda, lr 0.0007, warm-up 2000", "base")}
    with pytest.raises(SystemExit):
        curves.main(["--out", str(out), "--sizes", "base12", "--list"])
    assert "--sizes base12: run only with --device cuda" in capsys.readouterr().err


def records_key(curves, argv) -> str:
    from resnmt.study import records

    return records.settings_key(milestones.study_settings(curves.parser().parse_args(argv)))


def sweep_line(study, lr, warmup, updates, bleu, valid):
    return {"benchmark": "curves", "settings_key": f"k{lr}-{warmup}", "device": "cuda", "size": {"name": "base"},
            "row": "post_ln", "seed": 1, "updates": updates, "bleu": bleu, "valid": valid}


def test_choose_schedule_takes_the_lowest_loss_that_trains_the_safer_one_on_a_tie(tmp_path, monkeypatch):
    """study.choose_schedule: a candidate whose validation loss climbs again, or whose BLEU
    stalls, fails; of those that train the lowest validation loss wins, a lower peak within
    SWEEP_TIE of it is preferred; a missing candidate or none training gives the fallback."""
    monkeypatch.syspath_prepend(str(BENCH))
    from campaign import plan as study

    (a, b, c) = study.SWEEP_SCHEDULES
    keys = {cand: f"k{cand[0]}-{cand[1]}" for cand in study.SWEEP_SCHEDULES}
    lines = [
        sweep_line(study, *a, 1000, 20.0, [[500, 6.0, 5.0], [1000, 5.0, 4.0]]),
        sweep_line(study, *a, 2000, 30.0, [[1500, 4.50, 3.5], [2000, 4.40, 3.4]]),  # trains, lowest loss
        sweep_line(study, *b, 1000, 22.0, [[1000, 4.9, 3.9]]),
        sweep_line(study, *b, 2000, 25.0, [[1500, 4.3, 3.3], [2000, 4.6, 3.6]]),  # its loss climbs again: fails
        sweep_line(study, *c, 1000, 18.0, [[1000, 5.2, 4.2]]),
        sweep_line(study, *c, 2000, 28.0, [[2000, 4.43, 3.4]]),  # trains, within the tie of a's
    ]
    path = tmp_path / "curves.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    chosen, why = study.choose_schedule([path], keys)
    assert chosen == c and c[0] < a[0] and "fails (BLEU 25.0" in why  # c: the lower peak
    path.write_text("".join(json.dumps(x) + "\n" for x in lines[:4]), encoding="utf-8")
    assert study.choose_schedule([path], keys)[0] == study.FALLBACK_SCHEDULE  # c was not run
    stalled = [dict(x, bleu=5.0) for x in lines]
    path.write_text("".join(json.dumps(x) + "\n" for x in stalled), encoding="utf-8")
    assert study.choose_schedule([path], keys)[0] == study.FALLBACK_SCHEDULE
    # a lease of 620 s, 55 s per milestone: 20 updates/s shared, 4000 updates and 4 milestones each:
    # (620 - 4 x 55) s = 400 s of training, 20 x 400 = 8000 updates in all = 2 runs of 4000; at 30
    # updates/s 12000 = 3 runs, at 39.9 updates/s 15960 updates: still 3 (a run not finished is none)
    assert (study.LEASE_SECONDS, study.MILESTONE_SECONDS) == (620, 55)
    assert study.workers_for(20.0, 4000, 4) == 2
    assert study.workers_for(30.0, 4000, 4) == 3 and study.workers_for(39.9, 4000, 4) == 3
    assert study.workers_for(1.0, 4000, 4) == 1
    # the shared rate: each run's fairseq ups, the median of its newest 10 logged intervals
    for run, ups in (("post_ln.seed1", (1.0, 6.0, 7.0, 8.0)), ("pre_ln.seed1", (5.0,))):
        log = tmp_path / "runs" / "key" / "base" / run / "log.txt"
        log.parent.mkdir(parents=True)
        log.write_text("".join(f"x | INFO | train_inner | epoch 002:  {50 * i} / 207 loss=9.1, ups={u}, "
                               f"num_updates={50 * i}\n" for i, u in enumerate(ups)), encoding="utf-8")
    rates = study.updates_per_second(tmp_path / "runs")
    assert {run.name: ups for run, ups in rates.items()} == {"post_ln.seed1": 6.5, "pre_ln.seed1": 5.0}


def test_curves_list_names_the_update_a_partial_run_resumes_from(tmp_path, monkeypatch, capsys):
    """--list says which unfinished runs still have checkpoints here, and to which update."""
    monkeypatch.syspath_prepend(str(BENCH))
    from campaign import curves

    out, workdir = tmp_path / "curves.jsonl", tmp_path / "runs"
    key = default_settings_key(curves)
    ckpts = workdir / key / "small" / "rskip_ln_2.seed1" / "checkpoints"
    ckpts.mkdir(parents=True)
    for name in ("checkpoint_2_280.pt", "checkpoint_3_320.pt", "checkpoint_last.pt"):
        (ckpts / name).write_bytes(b"")
    assert curves.main(["--out", str(out), "--workdir", str(workdir), "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()

    def listed(row):
        return next(line for line in lines if re.match(rf"missing  small {re.escape(row)} +seed 1  ", line))

    assert listed("rskip_ln (λ=2)").endswith(f"milestones []  (checkpoints to update 320 in {workdir})")
    assert listed("post_ln").endswith("milestones []")


def test_updates_axis_is_logarithmic_where_budgets_span_a_factor_of_ten(monkeypatch):
    """2+2 budgets (200 to 19200 updates) get a log axis ticked at doubling budgets and the
    final budget marked; base size's 600 and 1200 keep a linear axis and no mark."""
    monkeypatch.syspath_prepend(str(BENCH))
    import matplotlib.pyplot as plt
    from plot_curves import FINAL_BUDGETS, updates_axis

    fig, (wide, narrow) = plt.subplots(1, 2)
    wide.plot([200, 600, 1200, 1800, 2400, 14400, 19200], range(7))
    wide.axhline(0.0)
    updates_axis(wide, "small")
    assert wide.get_xscale() == "log"
    assert [t.get_text() for t in wide.get_xticklabels()] == ["200", "600", "1200", "2400", "4800", "9600", "19200"]
    assert [line.get_xdata()[0] for line in wide.get_lines()[2:]] == [FINAL_BUDGETS["small"]] == [14400]
    narrow.plot([600, 1200], [1, 2])
    updates_axis(narrow, "base")
    assert narrow.get_xscale() == "linear" and len(narrow.get_lines()) == 1
    plt.close(fig)


def test_a_control_is_dashed_in_the_color_of_the_row_it_changes(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from plot_curves import row_styles

    styles = row_styles({("cpu", "deep"): {"post_ln": {}, "post_ln (warm-up 1000)": {}, "sas": {}},
                         ("cpu", "small"): {"rskip_ln (λ=2, warm-up 1000)": {}}})
    assert styles["post_ln (warm-up 1000)"] == {"color": styles["post_ln"]["color"], "linestyle": "--",
                                                "markerfacecolor": "white"}
    # without the row it changes, a control is a row of its own
    assert styles["rskip_ln (λ=2, warm-up 1000)"]["linestyle"] == "-"
    assert len({styles[r]["color"] for r in ("post_ln", "sas", "rskip_ln (λ=2, warm-up 1000)")}) == 3


def test_a_control_is_compared_with_post_ln_in_the_same_setting(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from campaign.tables import difference_table, reference_row

    assert reference_row("sas") == "post_ln" and reference_row("post_ln (warm-up 1000)") == "post_ln"
    assert reference_row("rskip_ln (λ=2, warm-up 1000)") == "post_ln (warm-up 1000)"
    record = lambda bleu: {"bleu": bleu}
    runs = {("cpu", "deep"): {"post_ln": {1: {600: record(7.0)}}, "post_ln (warm-up 1000)": {1: {600: record(5.0)}},
                              "rskip_ln (λ=2, warm-up 1000)": {1: {600: record(9.0)}}}}
    table = difference_table(runs)
    assert "| rskip_ln (λ=2, warm-up 1000) | post_ln (warm-up 1000) | +4.00 (1) |" in table
    assert "| post_ln (warm-up 1000) | post_ln | -2.00 (1) |" in table


def test_the_mean_line_breaks_where_the_seeds_change(monkeypatch):
    """Three seeds to 2400 updates, two of them to 4800 and 7200, one to 9600: the mean is
    drawn over three seeds, then over two, never across the change (it would jump with the
    seeds' composition, not with training), and not past the last budget two seeds reached."""
    monkeypatch.syspath_prepend(str(BENCH))
    from plot_curves import bleu_of, mean_segments
    from campaign.tables import paired_differences

    record = lambda bleu: {"bleu": bleu}
    seeds = {1: {600: record(15.0), 2400: record(30.0), 4800: record(33.0), 7200: record(35.0),
                 9600: record(36.0)},
             2: {600: record(14.0), 2400: record(29.0), 4800: record(32.0), 7200: record(34.0)},
             3: {600: record(13.0), 2400: record(28.0)}}
    assert mean_segments(bleu_of(seeds)) == [([600, 2400], [14.0, 29.0]), ([4800, 7200], [32.5, 34.5])]
    assert mean_segments(bleu_of({1: seeds[1]})) == [([600, 2400, 4800, 7200, 9600], [15.0, 30.0, 33.0, 35.0, 36.0])]
    # seed 3 missing at 1200 only: the line breaks around it and resumes with all three
    gappy = {1: {600: 1.0, 1200: 2.0, 2400: 4.0}, 2: {600: 3.0, 1200: 4.0, 2400: 6.0}, 3: {600: 2.0, 2400: 5.0}}
    assert mean_segments(gappy) == [([600], [2.0]), ([1200], [3.0]), ([2400], [5.0])]
    # the differences pair seed with seed, at the budgets both reached; seed 3 has no post_ln
    rows = {"post_ln": {s: seeds[s] for s in (1, 2)},
            "sas": {1: {600: record(16.0), 4800: record(32.0)}, 2: {600: record(13.0)}, 3: {600: record(20.0)}}}
    assert paired_differences(rows, "sas") == {1: {600: 1.0, 4800: -1.0}, 2: {600: -1.0}}
    assert paired_differences(rows, "pre_ln") == {}


def test_encoder_gradient_share_by_hand(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from plot_curves import encoder_gradient_share

    record = {"analysis": {"statistics": {"grad_norm": {"encoder": {"output": [0.1, 0.2, 0.6]},
                                                         "decoder": {"output": [0.5, 0.8]}}}}}
    assert encoder_gradient_share(record) == pytest.approx((0.1 + 0.2 + 0.6) / 3 / 0.8)


# Where each generated table lives: exactly one document of the repository (None: printed only,
# the 600-update quality runs, whose records are benchmarks/results/quality.jsonl).
TABLE_HOMES = {
    "speed-table": "docs/benchmarks.md", "fp16-table": "docs/benchmarks.md",
    "fp16-headroom-table": "docs/benchmarks.md", "quality-table": None,
    "curves-table": "docs/study-results.md", "glance-table": "docs/study.md", "speed-glance": "README.md",
    "cross-layer-table": "docs/study.md",
    "gen2025-table": "docs/study.md", "gpu-train-table": "docs/benchmarks.md", "pairs-table": "docs/study.md",
    "pairs-glance": "README.md", "decode-speed-table": "docs/decoding-and-evaluation.md",
}


def test_each_generated_table_lives_in_one_document(monkeypatch):
    """Every marker pair of make_tables.py is in exactly one of README.md and docs/*.md, the
    one named in TABLE_HOMES (no generated table is copied twice), or in none."""
    monkeypatch.syspath_prepend(str(BENCH))
    import make_tables

    begins = [begin for begin, _ in make_tables.MARKERS.values()]
    names = {re.match(r"<!-- (.+):begin -->", b).group(1) for b in begins}
    assert names == set(TABLE_HOMES)
    docs = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    for name in names:
        holders = [d.relative_to(REPO_ROOT).as_posix() for d in docs
                   if f"<!-- {name}:begin -->" in d.read_text(encoding="utf-8")]
        assert holders == ([TABLE_HOMES[name]] if TABLE_HOMES[name] else []), (name, holders)
        if TABLE_HOMES[name] is None:
            continue
        text = (REPO_ROOT / TABLE_HOMES[name]).read_text(encoding="utf-8")
        assert text.count(f"<!-- {name}:begin -->") == 1 and text.count(f"<!-- {name}:end -->") == 1


def test_glance_tables_are_generated(monkeypatch):
    """The study's verdicts per claim (docs/study.md) and the README's speed at a glance are
    what the generators write from the committed results (make_tables.py --write)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import make_tables
    from campaign import tables as study_tables

    study = (REPO_ROOT / "docs" / "study.md").read_text(encoding="utf-8")
    glance = study_tables.glance_table(study_tables.load(BENCH / "results" / "curves.jsonl"))
    begin, end = study_tables.MARKERS["glance-table"]
    assert f"{begin}\n{glance}\n{end}" in study
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    speed = [json.loads(x) for x in (BENCH / "results" / "speed.jsonl").read_text(encoding="utf-8").splitlines()]
    speed = [r for r in speed if r.get("benchmark") == "speed"]
    gpu = [json.loads(x) for x in (BENCH / "results" / "gpu_train.jsonl").read_text(encoding="utf-8").splitlines()]
    begin, end = make_tables.MARKERS["speed-glance"]
    assert f"{begin}\n{make_tables.speed_glance(speed, gpu)}\n{end}" in readme


def test_speed_glance_shows_a_gpu_ratio_only_where_it_is_resolved(monkeypatch):
    """The glance's GPU column: a trainer ratio measured over 4 rounds or more beside the job's
    noise floor; fewer rounds, or no noise floor, show no column and say why."""
    monkeypatch.syspath_prepend(str(BENCH))
    import result_tables

    speed = [{"settings": {"device": "cpu"}, "run_id": "r1", "row": "pre_ln",
              **{k: {"median": v} for k, v in (("train_ratio", 0.99), ("decode_ratio", 1.02), ("memory_ratio", 1.0))}}]
    row = {"kind": "row", "config": "pre_ln", "dtype": "bf16", "max_tokens": 4096, "ratio": 0.97, "rounds": 3,
           "noise_floor": 0.01}
    unresolved = result_tables.speed_glance(speed, [row])
    assert "GPU" not in unresolved.splitlines()[0] and "no kind's training ratio is measured yet" in unresolved
    assert "GPU" not in result_tables.speed_glance(speed, [{**row, "rounds": 4, "noise_floor": None}]).splitlines()[0]
    resolved = result_tables.speed_glance(speed, [{**row, "rounds": 4}])
    assert resolved.splitlines()[0].endswith("| GPU bf16 train (noise floor) |")
    assert "| pre_ln | 0.99 | 1.02 | 1.00 | 0.97 (±1 %) |" in resolved and "measured yet" not in resolved


def test_glance_table_from_handwritten_curves(tmp_path, monkeypatch):
    """Paired by seed at the claim's budget; the verdict follows the seeds' signs (a claim of
    matching: within 0.5 BLEU behind); a claim may name its reference; --write
    fills the glance markers and refuses a file with no marker of make_tables.py."""
    monkeypatch.syspath_prepend(str(BENCH))
    from campaign import tables as study_tables

    def line(row, seed, updates, bleu):
        return {"benchmark": "curves", "size": {"name": "small"}, "row": row, "seed": seed, "updates": updates,
                "bleu": bleu, "device": "cpu"}

    lines = [line("post_ln", s, u, b) for s, u, b in ((1, 100, 10.0), (2, 100, 11.0), (1, 200, 20.0), (2, 200, 21.0))]
    lines += [line("sas", 1, 200, 21.0), line("sas", 2, 200, 20.5), line("sas", 3, 200, 30.0),
              line("pre_ln", 1, 200, 21.0), line("pre_ln", 2, 200, 22.0),
              line("pre_ln + rms_norm", 1, 200, 20.7), line("pre_ln + rms_norm", 2, 200, 21.6)]
    results = tmp_path / "curves.jsonl"
    results.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    claims = (study_tables.Claim("SAS > post-LN", "32.0 vs 30.9", "cpu", "small", "sas", 200),
              study_tables.Claim("pre-LN > post-LN", "—", "cpu", "small", "pre_ln", 200, "a note"),
              study_tables.Claim("not run", "—", "cpu", "small", "rezero", 200),
              study_tables.Claim("RMSNorm ≥ LayerNorm", "—", "cpu", "small", "pre_ln + rms_norm", 200,
                                 reference="pre_ln", at_least=True, method="RMSNorm"),
              study_tables.Claim("RMSNorm > LayerNorm", "—", "cpu", "small", "pre_ln + rms_norm", 200,
                                 reference="pre_ln", method="RMSNorm"),
              study_tables.Claim("RMSNorm > post-LN", "(a paper)", "cpu", "small", "pre_ln + rms_norm", 100,
                                 method="RMSNorm"))
    table = study_tables.glance_table(study_tables.load(results), claims)
    # seed 3 of sas has no post_ln partner: left out
    lines = table.splitlines()
    assert lines[0].startswith("| method | claim | setting | papers | measured") and len(lines) == 2 + 3
    assert lines[2] == ("| SAS > post-LN | SAS > post-LN | 2+2, d=128, 200 updates | 32.0 vs 30.9 | "
                        "20.75 ± 0.35 vs 20.50 ± 0.71, +0.25 ± 1.06 (2) | mixed |")
    assert lines[3] == ("| pre-LN > post-LN | pre-LN > post-LN | 2+2, d=128, 200 updates | — | "
                        "21.50 ± 0.71 vs 20.50 ± 0.71, +1.00 ± 0.00 (2) | yes; a note |")
    assert "not run" not in table
    # one row per method, a line per claim; against its own reference; a claim of matching
    # holds within 0.5 BLEU behind (-0.3, -0.4); pre_ln + rms_norm has no 100-update line
    assert lines[4] == ("| RMSNorm | RMSNorm ≥ LayerNorm<br>RMSNorm > LayerNorm | 2+2, d=128, 200 updates<br>"
                        "2+2, d=128, 200 updates | — | 21.15 ± 0.64 vs 21.50 ± 0.71, -0.35 ± 0.07 (2)<br>"
                        "21.15 ± 0.64 vs 21.50 ± 0.71, -0.35 ± 0.07 (2) | yes<br>no |")
    # --write, from the committed results: a file gets the tables whose markers it holds
    doc = tmp_path / "doc.md"
    doc.write_text("a\n<!-- glance-table:begin -->\nstale\n<!-- glance-table:end -->\nb\n", encoding="utf-8")
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n", encoding="utf-8")
    argv = [sys.executable, BENCH / "make_tables.py", "--results", tmp_path, "--write", doc]
    run_cli(argv)
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("a\n<!-- glance-table:begin -->\n| method | claim |")
    assert "stale" not in text and text.endswith("b\n")
    assert "curves-table" not in text and "sacreBLEU mean ± std over seeds" not in text
    bad = run_cli([*argv[:-1], bare], check=False)
    assert bad.returncode == 2 and "none of the tables' markers" in bad.stderr


def test_cross_layer_table_from_handwritten_curves(monkeypatch, tmp_path):
    """The newest budget seed 1 of each pair shares, paired by seed: 2+2 minus post-LN, 6+6
    minus pre-LN and minus post-LN; a gap within 0.5 BLEU counts as level (with two seeds
    "mixed" where they disagree), and no verdict before 2400 (2+2) or 1200 (6+6) updates;
    rows not trained are left out;
    the study's figures keep the papers' rows and the cross-layer figure gets the new ones
    with their references."""
    monkeypatch.syspath_prepend(str(BENCH))
    import plot_curves
    from campaign import tables as study_tables

    def line(size, row, updates, bleu, seed=1):
        return {"benchmark": "curves", "size": {"name": size}, "row": row, "seed": seed, "updates": updates,
                "bleu": bleu, "device": "cpu"}

    lines = [line("small", "post_ln", 600, 15.0), line("small", "post_ln", 1200, 24.0),
             line("small", "post_ln", 2400, 30.0), line("small", "post_ln", 2400, 31.0, seed=2),
             line("small", "b2t", 600, 14.0), line("small", "b2t", 1200, 23.7), line("small", "b2t", 2400, 29.7),
             line("small", "dlcl", 600, 13.0),
             line("deep", "post_ln", 600, 7.5), line("deep", "pre_ln", 600, 15.6), line("deep", "pre_ln", 1200, 26.8),
             line("deep", "b2t", 600, 17.1), line("deep", "b2t", 1200, 25.0), line("deep", "sas", 600, 16.2)]
    results = tmp_path / "curves.jsonl"
    results.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    runs = study_tables.load(results)
    table = study_tables.cross_layer_table(runs)
    assert "| b2t | -0.30 @ 2400 | -1.80 @ 1200 | +9.60 @ 600 | yes | no |" in table
    assert "| dlcl | -2.00 @ 600 |  |  | not yet | — |" in table
    assert "resi_dual" not in table and "sas" not in table
    # a second seed: paired by seed at seed 1's budget, mean ± std, and the seeds disagree
    runs[("cpu", "small")]["b2t"][2][2400] = dict(lines[3], row="b2t", bleu=29.9)
    assert ("| b2t | -0.70 ± 0.57 @ 2400 (2 seeds) | -1.80 @ 1200 | +9.60 @ 600 | mixed | no |"
            in study_tables.cross_layer_table(runs))
    runs[("cpu", "small")]["b2t"][2][2400]["bleu"] = 30.8
    assert "| b2t | -0.25 ± 0.07 @ 2400 (2 seeds) | -1.80 @ 1200 | +9.60 @ 600 | yes | no |" in (
        study_tables.cross_layer_table(runs))
    study, families = plot_curves.split_rows(runs)
    cross = families["cross-layer"]
    assert set(families) == {"cross-layer"}  # no 2025 row has a milestone here
    assert set(study[("cpu", "deep")]) == {"post_ln", "pre_ln", "sas"}
    assert set(cross[("cpu", "deep")]) == {"post_ln", "pre_ln", "b2t"}
    assert set(cross[("cpu", "small")]["post_ln"][1]) == {600, 1200, 2400}
    runs[("cpu", "deep")]["hyper"][1][600] = dict(lines[-1], row="hyper")
    study, families = plot_curves.split_rows(runs)
    assert set(families) == {"cross-layer", "gen2025"} and "hyper" not in study[("cpu", "deep")]
    assert set(families["gen2025"][("cpu", "deep")]) == {"post_ln", "pre_ln", "hyper"}
    assert "| hyper | " in study_tables.cross_layer_table(runs, rows=("hyper",))
    # Mix-LN at 2+2 is pre-LN's run bit for bit (rows.SAME_RUN): read from it and marked
    runs[("cpu", "small")]["pre_ln"][1][2400] = dict(lines[2], row="pre_ln", bleu=29.5)
    assert ("| mix_ln | -0.50 @ 2400 (= pre_ln: the same run) |  |  | yes | — |"
            in study_tables.cross_layer_table(runs, rows=("mix_ln",)))
    # every method is judged at the verdict budget, also where both rows trained on
    runs[("cpu", "small")]["pre_ln"][1][4800] = dict(lines[2], row="pre_ln", updates=4800, bleu=33.0)
    runs[("cpu", "small")]["post_ln"][1][4800] = dict(lines[2], updates=4800, bleu=35.0)
    assert ("| mix_ln | -0.50 @ 2400 (= pre_ln: the same run) |  |  | yes | — |"
            in study_tables.cross_layer_table(runs, rows=("mix_ln",)))


def test_a_run_that_is_another_rows_run_is_not_queued(monkeypatch):
    """The study does not train Mix-LN at 2+2 again (it is pre-LN's run), but does at 6+6."""
    monkeypatch.syspath_prepend(str(BENCH))
    from campaign import rows
    from campaign import plan as study

    assert rows.SAME_RUN == {("small", "mix_ln"): "pre_ln"}
    assert ("small", "mix_ln", 1) not in study.STUDY_ORDER and ("deep", "mix_ln", 1) in study.STUDY_ORDER
    assert ("small", "pre_ln", 1) in study.STUDY_ORDER


def test_recorded_paths_hold_no_machines_folders(tmp_path, monkeypatch):
    """A path in a results line is relative to the folder the command runs in (the lab's: the
    repository), else led by its dataset's name, else its name alone; every committed results
    file holds none of a machine's folders."""
    monkeypatch.syspath_prepend(str(BENCH))
    from resnmt.study.records import portable_argv, portable_path

    monkeypatch.chdir(REPO_ROOT)
    assert portable_path(REPO_ROOT / "data" / "multi30k" / "bin") == "data/multi30k/bin"
    corpus = tmp_path / "multi30k"
    assert portable_path(corpus / "raw" / "test.de", corpus) == "multi30k/raw/test.de"
    assert portable_path(tmp_path / "elsewhere" / "test.de", corpus) == "test.de"
    assert portable_argv(["-m", "fairseq_cli.train", "--user-dir", str(REPO_ROOT / "resnmt"), str(corpus / "bin"),
                          "--save-dir", str(tmp_path / "gpu_train-x1")], corpus) == [
        "-m", "fairseq_cli.train", "--user-dir", "resnmt", "multi30k/bin", "--save-dir", "gpu_train-x1"]

    def strings(value):
        if isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)
        elif isinstance(value, str):
            yield value

    results = sorted((BENCH / "results").glob("*.json*"))
    assert results
    for path in results:
        text = path.read_text(encoding="utf-8")
        records = [json.loads(line) for line in text.splitlines()] if path.suffix == ".jsonl" else [json.loads(text)]
        absolute = {s for r in records for s in strings(r) if s.startswith("/") and "/" in s[1:]}
        assert not absolute, (path.name, sorted(absolute)[:3])


def test_pairs_table_and_second_seeds_from_handwritten_curves(monkeypatch):
    """A claim on two pairs: each pair's difference paired by seed at the size's verdict
    budget, each pair's verdict and the verdict across them (the table, and the README's lines
    grouping the claims by it); seed 2 of a row and its
    reference is planned on EN-FR where seed 1's margin there is within 0.5 BLEU of zero or
    of the other sign than EN-DE's mean; the EN-FR lines are another setting, named."""
    monkeypatch.syspath_prepend(str(BENCH))
    from campaign import tables as study_tables

    def line(corpus, size, row, seed, updates, bleu):
        return {"benchmark": "curves", "size": {"name": size}, "row": row, "seed": seed, "updates": updates,
                "bleu": bleu, "device": "cpu", "settings": {"corpus": corpus}}

    de, fr = "multi30k", "multi30k-en-fr"
    lines = [line(de, "small", "post_ln", 1, 2400, 30.0), line(de, "small", "post_ln", 2, 2400, 30.2),
             line(de, "small", "hybrid_norm", 1, 2400, 30.9), line(de, "small", "hybrid_norm", 2, 2400, 31.0),
             line(de, "small", "hyper", 1, 2400, 31.0),
             line(fr, "small", "post_ln", 1, 2400, 40.0), line(fr, "small", "hybrid_norm", 1, 2400, 39.5),
             line(fr, "small", "hyper", 1, 2400, 41.0), line(fr, "small", "hyper", 1, 1200, 30.0),
             line(de, "deep", "pre_ln", 1, 1200, 26.0), line(de, "deep", "mhc", 1, 1200, 27.0),
             line(fr, "deep", "pre_ln", 1, 1200, 30.0), line(fr, "deep", "mhc", 1, 1200, 30.3),
             line(de, "deep", "denseformer", 1, 1200, 27.5)]
    runs = study_tables.runs_of(lines)
    assert set(runs) == {("cpu", "small"), ("cpu, Multi30k EN-FR", "small"), ("cpu", "deep"),
                         ("cpu, Multi30k EN-FR", "deep")}
    table = study_tables.pairs_table(runs).splitlines()
    assert table[0] == ("| claim | setting | Multi30k EN-DE: difference (n) | holds? | Multi30k EN-FR: difference (n) "
                        "| holds? | across the pairs |")
    assert ("| HybridNorm > post-LN | 2+2, d=128, 2400 updates | +0.85 ± 0.07 (2) | yes | -0.50 (1) | no (1 seed) "
            "| reverses |") in table
    assert ("| Hyper-Connections > post-LN | 2+2, d=128, 2400 updates | +1.00 (1) | yes (1 seed) | +1.00 (1) "
            "| yes (1 seed) | holds on both |") in table
    assert ("| mHC > pre-LN | 6+6, d=128, 1200 updates | +1.00 (1) | yes (1 seed) | +0.30 (1) | level (1 seed) "
            "| holds on one |") in table
    assert not any(x.startswith("| B2T") for x in table)  # measured on neither pair
    # HybridNorm flips sign, mHC is within 0.5 of zero: seed 2 of each row and its reference
    assert study_tables.second_seeds(runs) == [("small", "hybrid_norm", 2), ("small", "post_ln", 2),
                                               ("deep", "mhc", 2), ("deep", "pre_ln", 2)]
    # the README's lines: each claim under its verdict across the pairs, DenseFormer not yet on EN-FR
    assert study_tables.pairs_glance(runs).splitlines() == [
        "Each claim on a second pair, Multi30k EN-FR (1 seed each so far):", "",
        "- Holds on EN-DE and EN-FR: Hyper-Connections > post-LN (2+2).",
        "- Holds on EN-DE, level on EN-FR: mHC > pre-LN (6+6).",
        "- Reverses: HybridNorm > post-LN (2+2).",
        "- Not yet measured on EN-FR: DenseFormer > pre-LN (6+6)."]
    assert study_tables.seed_counts([1, 2, 1], unfinished=False) == " (1 or 2 seeds per claim)"
    assert study_tables.seed_counts([2, 2], unfinished=False) == " (2 seeds each)"
    assert study_tables.across_pairs([0.3], []) == "not yet"
    assert study_tables.across_pairs([0.9, 0.8], [0.4, -0.1]) == "holds on one"  # level on the second
    assert study_tables.across_pairs([0.9, 0.8], [0.9, -0.2]) == "holds on one"  # mixed on the second
    assert study_tables.across_pairs([-0.9], [0.2]) == "fails on one"
    assert study_tables.across_pairs([0.3], [-0.2]) == "level"


def test_curves_pair_picks_the_plan_the_corpus_and_the_settings_key(tmp_path, monkeypatch, capsys):
    """--pair en-de keeps the study's settings key (the committed lines' own); en-fr has
    another, its own plan and milestones, refuses a run of another plan and a corpus of
    another pair (one line each); its lines name the pair in their settings."""
    monkeypatch.syspath_prepend(str(BENCH))
    from campaign import curves
    from resnmt.study import records

    def key(*argv):
        return records.settings_key(milestones.study_settings(curves.parser().parse_args(list(argv))))

    lines = [json.loads(x) for x in (BENCH / "results" / "curves.jsonl").read_text(encoding="utf-8").splitlines()]
    en_de = {r["settings_key"] for r in lines if r.get("device", "cpu") == "cpu" and r["settings"]["corpus"] == "multi30k"}
    assert key() == key("--pair", "en-de") and key() in en_de
    assert key("--pair", "en-fr") != key() and key("--pair", "en-fr") not in en_de
    assert milestones.study_settings(curves.parser().parse_args(["--pair", "en-fr"]))["corpus"] == "multi30k-en-fr"
    out = tmp_path / "curves.jsonl"
    assert curves.main(["--pair", "en-fr", "--out", str(out), "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 11 and all(x.startswith("missing") for x in listed)
    assert [x.split()[1:3] for x in listed[:4]] == [["small", "post_ln"], ["small", "hybrid_norm"],
                                                   ["small", "pre_ln"], ["small", "hyper"]]
    with pytest.raises(SystemExit):
        curves.main(["--pair", "en-fr", "--out", str(out), "--only", "deep:sas:1", "--list"])
    assert "--only deep:sas:1: not in the en-fr study" in capsys.readouterr().err.splitlines()[-1]
    data = tmp_path / "corpus"
    (data / "bin").mkdir(parents=True)
    (data / "bin" / "dict.en.txt").write_text("a 1\n")
    (data / "bin" / "train.en-de.en.idx").write_bytes(b"")
    with pytest.raises(SystemExit):
        curves.main(["--pair", "en-fr", "--data", str(data), "--out", str(out)])
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.endswith(f"--data {data}: its binarized data is en-de, not en-fr; prepare en-fr with "
                        "resnmt-prepare multi30k-en-fr DIR (see --help)")


def test_multi30k_en_fr_pins_the_published_files():
    """resnmt-prepare multi30k-en-fr fetches the published EN-FR files, each with the sha256
    of the copy in ../shared/data, under their published names."""
    from resnmt.data.corpora import DATASETS

    sums = dict(reversed(x.split()) for x in (REPO_ROOT.parent / "shared" / "data" / "multi30k-en-fr" / "SHA256SUMS")
                .read_text().splitlines())
    ds = DATASETS["multi30k-en-fr"]
    assert (ds.src, ds.tgt) == ("en", "fr")
    assert {f.name: f.sha256 for f in ds.files} == sums
    assert all(f.url.endswith("/data/task1/raw/" + f.name) for f in ds.files)
    assert DATASETS["multi30k"].langs == ("en", "de") and len(DATASETS["multi30k"].files) == 6


def test_the_library_never_imports_the_lab_nor_names_the_repository():
    """resnmt/ is the library: no module of it imports the lab (benchmarks/, its campaign)
    or names the repository's folders, a GPU lease, a working session or a date (a log
    line's time stamp shown as an example of a format is not one)."""
    import re

    banned = re.compile(r"^\s*(from|import)\s+(campaign|benchmarks)\b|REPO_ROOT|benchmarks/|\blease\b|working "
                        r"(day|session)|GPU job|\b20\d\d-\d\d-\d\d\b(?! \d\d:\d\d)", re.M)
    found = [f"{path.relative_to(REPO_ROOT)}: {m.group(0).strip()}" for path in sorted((REPO_ROOT / "resnmt").rglob("*.py"))
             for m in banned.finditer(path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_shipped_reference_rows_are_the_studys_lines_of_the_protocols_settings(monkeypatch):
    """resnmt/study/reference.jsonl (package data) is what benchmarks/reference_rows.py
    makes of the committed results, and the GPU protocol's schedule is the one the study's
    sweep rule picks from them."""
    monkeypatch.syspath_prepend(str(BENCH))
    import reference_rows
    from campaign import curves
    from campaign.plan import sweep_choice
    from campaign.files import RESULTS
    from resnmt.study.verdict import CUDA, REFERENCE

    assert REFERENCE.read_text(encoding="utf-8") == reference_rows.reference_text(
        milestones.read_jsonl(RESULTS / "curves.jsonl"))
    settings = milestones.study_settings(curves.parser().parse_args(["--device", "cuda", "--sizes", "base"]))
    assert sweep_choice(settings, [RESULTS / "curves.jsonl"])[0] == CUDA.schedule
    assert '"resnmt.study": ["reference.jsonl"]' in (REPO_ROOT / "setup.py").read_text(encoding="utf-8")


def test_decode_speed_table_takes_the_least_cpu_seconds_and_the_noise_floor():
    """decode_speed.py's table: per engine the least CPU seconds over the rounds, its ratio to
    fairseq's least, and the noise floor of fairseq's search measured twice per round."""
    sys.path.insert(0, str(BENCH))
    from result_tables import decode_speed_tables

    common = {"benchmark": "decode_speed", "run_id": "2026-01-01T00:00:00Z", "threads": 1, "part": "decode",
              "model": "2+2 d=128", "kind": "post_ln", "setting": "32", "sentences": 100, "weights": "trained",
              "max_len_b": 200, "machine": {"cpus": 2, "torch": "2.x"}}
    cpu = {("fairseq", 1, 1): 10.0, ("fairseq", 1, 2): 11.0, ("fast", 1, 1): 4.0, ("ctranslate2", 1, 1): 5.0,
           ("fairseq", 2, 1): 12.0, ("fairseq", 2, 2): 9.0, ("fast", 2, 1): 2.5, ("ctranslate2", 2, 1): 4.0}
    records = [dict(common, engine=e, round=r, repeat=k, cpu_s=s, wall_s=s,
                    lines_differing=0 if e != "fairseq" else None)
               for (e, r, k), s in cpu.items()]
    table = decode_speed_tables(records)
    assert "| resnmt's fast beam search | 2.50 s (40/s) **3.60x** | 0 |" in table  # 9.0 / 2.5
    assert "| CTranslate2 float32 | 4.00 s (25/s) **2.25x** | 0 |" in table
    assert "batch 32 33 %" in table  # round 2: 12 / 9


def test_decode_speed_profile_splits_each_searchs_least_round():
    """decode_speed.py --profile's table: each search's round of least CPU seconds, its parts in
    seconds and as shares of that round."""
    sys.path.insert(0, str(BENCH))
    from result_tables import decode_speed_tables

    common = {"benchmark": "decode_speed", "run_id": "2026-01-01T00:00:00Z", "threads": 1, "part": "profile",
              "model": "2+2 d=128", "kind": "post_ln", "setting": "32", "sentences": 200, "weights": "trained",
              "max_len_b": 200, "machine": {"cpus": 2, "torch": "2.x"}, "repeat": 1}

    def parts(model, search):
        return {"data loading": 0.5, "decoder layers": model, "search bookkeeping": search}

    records = [dict(common, engine="fairseq", round=1, parts=parts(4.0, 5.5), cpu_s=10.0),
               dict(common, engine="fairseq", round=2, parts=parts(5.0, 6.5), cpu_s=12.0),
               dict(common, engine="fast", round=1, parts=parts(3.0, 1.5), cpu_s=5.0),
               dict(common, engine="fast", round=2, parts=parts(2.0, 1.5), cpu_s=4.0)]
    table = decode_speed_tables(records)
    assert "batch 32, rounds: 2" in table
    assert "| decoder layers | 4.00 s (40 %) | 2.00 s (50 %) |" in table  # fairseq's round 1, fast's round 2
    assert "| search bookkeeping | 5.50 s (55 %) | 1.50 s (38 %) |" in table
    assert "| **all** | **10.00 s** | **4.00 s** |" in table


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")
                                          if re.search(r"^def main\(argv", p.read_text(encoding="utf-8"), re.M)))
def test_every_benchmark_command_imports_and_prints_its_help(script, capsys, monkeypatch):
    """Each benchmark command's imports resolve and its --help prints (a module moved away from
    under a benchmark fails here, not on the next measuring run)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}", BENCH / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out
