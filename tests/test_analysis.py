"""resnmt.analysis and resnmt-analyze: statistics against hand computations from the
papers' equations, gradient norms against plain autograd, the CLI's files and errors,
and --log-connection-stats in a real fairseq-train JSON log."""
import json
import re

import pytest
import torch
import torch.nn.functional as F
from fairseq import checkpoint_utils

from conftest import REPO_ROOT, built_once, cli_env, forked, run_cli
from model_utils import TINY, block_output_gradients, build, move_connections_off_init, randomize_norms, sample_batch
from resnmt.analysis.gradients import block_gradient_norms
from resnmt.analysis.hooks import Accumulator, StatsCollector
from resnmt.analysis.training_log import attach_training_logger
from resnmt.cli.analyze import main as analyze_main

USER_DIR = str(REPO_ROOT / "resnmt")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ helpers

def capture_inputs(module):
    """Forward hook keeping the (positional) inputs of ``module``'s last call."""
    seen = {}
    handle = module.register_forward_hook(lambda m, inputs, out: seen.update(inputs=inputs))
    return seen, handle


def masked_mean(values, keep):
    """Mean of ``values`` (T, B) over positions where ``keep`` (T, B) is True."""
    return float(values.detach().double()[keep].mean())


def collect(model, sample):
    """Run ``model`` on ``sample`` with a StatsCollector; (means, encoder keep, decoder keep)."""
    acc = Accumulator()
    with StatsCollector(model, acc):
        model(**sample["net_input"])
    keep_enc = sample["net_input"]["src_tokens"].ne(1).t()
    keep_dec = sample["net_input"]["prev_output_tokens"].ne(1).t()
    assert not keep_enc.all() and not keep_dec.all(), "the test batch must contain padding"
    return acc.means(), keep_enc, keep_dec


def sas_gate_by_hand(gates, z, i):
    """Gate i of ScalarGates, two-layer form: sigmoid(tanh(z W_f + b_f) W_ff + b_ff)."""
    h = gates.hidden_dim
    hidden = torch.tanh(z @ gates.hidden.weight[i * h:(i + 1) * h].t() + gates.hidden.bias[i * h:(i + 1) * h])
    return torch.sigmoid(hidden @ gates.out_weight[i] + gates.out_bias[i])


# ------------------------------------------------------------------ statistics vs. equations

def test_sas_gates_equal_the_gate_equation_over_real_tokens(tiny_bin):
    model, task, _ = build(tiny_bin, "transformer_sas_base", ["--sas-alpha-bias-init", "1", "--sas-beta-bias-init", "-1"])
    randomize_norms(model)
    model.eval()
    sample = sample_batch(task, 6)
    enc_self = model.encoder.layers[0].self_attn_connection
    dec_cross = model.decoder.layers[1].encoder_attn_connection
    seen_enc, h1 = capture_inputs(enc_self)
    seen_dec, h2 = capture_inputs(dec_cross)
    with torch.no_grad():
        means, keep_enc, keep_dec = collect(model, sample)
    h1.remove(), h2.remove()
    for conn, seen, keep, site in [(enc_self, seen_enc, keep_enc, ("encoder", 0, "self")),
                                   (dec_cross, seen_dec, keep_dec, ("decoder", 1, "cross"))]:
        x, fx = seen["inputs"]
        z = torch.cat((x, fx), dim=-1)
        with torch.no_grad():
            alpha, beta = sas_gate_by_hand(conn.gates, z, 0), sas_gate_by_hand(conn.gates, z, 1)
        gamma = (1 - alpha) * (1 - beta)
        assert means["sas_alpha"][site] == pytest.approx(masked_mean(alpha, keep), abs=1e-6)
        assert means["sas_beta"][site] == pytest.approx(masked_mean(beta, keep), abs=1e-6)
        assert means["sas_gamma"][site] == pytest.approx(masked_mean(gamma, keep), abs=1e-6)
        # padding is really excluded: the mean over every position is a different number
        assert abs(float(alpha.double().mean()) - means["sas_alpha"][site]) > 1e-5
    # 2 encoder layers x 2 sublayers + 2 decoder layers x 3 sublayers
    assert len(means["sas_alpha"]) == 10


@pytest.mark.parametrize("skip_lambda", [2, 3])
def test_rskip_ratio_equals_one_plus_products_of_sigma_over_w(tiny_bin, skip_lambda):
    model, task, _ = build(tiny_bin, "transformer_rskip_base", ["--skip-lambda", str(skip_lambda)])
    randomize_norms(model)
    model.eval()
    conn = model.encoder.layers[1].ffn_connection
    seen, handle = capture_inputs(conn)
    with torch.no_grad():
        means, keep_enc, _ = collect(model, sample_batch(task, 6))
    handle.remove()
    x, fx = (t.double() for t in seen["inputs"])
    norms = list(conn.norms)
    # lambda = 2: x : F = sigma_1 / w_1 + 1, sigma_1 = std of x + F over features (with LN eps)
    # lambda = 3: 1 + s1/w1 + s1 s2 / (w1 w2), sigma_2 = std of x + LN_1(x + F)
    z1 = x + fx
    s1 = torch.sqrt(z1.var(-1, unbiased=False, keepdim=True) + norms[0].eps)
    w1 = norms[0].weight.double()
    ratio = 1 + s1 / w1
    if skip_lambda == 3:
        y1 = F.layer_norm(z1, (z1.size(-1),), w1, norms[0].bias.double(), norms[0].eps)
        z2 = x + y1
        s2 = torch.sqrt(z2.var(-1, unbiased=False, keepdim=True) + norms[1].eps)
        ratio = ratio + (s1 / w1) * (s2 / norms[1].weight.double())
    expected = masked_mean(ratio.mean(-1), keep_enc)
    assert means["rskip_ratio"][("encoder", 1, "ffn")] == pytest.approx(expected, rel=1e-5)
    assert expected > 1.5  # sigma/w is O(1) here: the test would notice a missing term


def test_highway_gate_and_nrelu_statistics_equal_their_formulas(tiny_bin):
    model, task, _ = build(tiny_bin, "transformer_highway_base", ["--normalized-activation", "nrelu"])
    model.eval()
    conn = model.decoder.layers[0].self_attn_connection
    act = model.decoder.layers[1].ffn_activation
    seen_conn, h1 = capture_inputs(conn)
    seen_act, h2 = capture_inputs(act)
    with torch.no_grad():
        means, _, keep_dec = collect(model, sample_batch(task, 6))
    h1.remove(), h2.remove()
    x = seen_conn["inputs"][0].double()
    t = torch.sigmoid(x @ conn.transform_gate.weight.double().t() + conn.transform_gate.bias.double())
    assert means["highway_gate"][("decoder", 0, "self")] == pytest.approx(masked_mean(t.mean(-1), keep_dec), abs=1e-6)

    h = seen_act["inputs"][0].double()
    a = torch.relu(h)
    rho = (a.var(-1, unbiased=False) / (h.var(-1, unbiased=False) + 1e-6)).clamp(0.01, 2.0)
    rho_prime = (h > 0).double().mean(-1).clamp(0.01, 2.0)
    lam = torch.sqrt((1 / rho + 1 / rho_prime) / 2)
    site = ("decoder", 1, "ffn")
    assert means["act_rho"][site] == pytest.approx(masked_mean(rho, keep_dec), rel=1e-4)
    assert means["act_rho_prime"][site] == pytest.approx(masked_mean(rho_prime, keep_dec), rel=1e-5)
    assert means["act_lambda"][site] == pytest.approx(masked_mean(lam, keep_dec), rel=1e-4)


def test_gradient_norms_equal_autograd_and_do_not_depend_on_batching(tiny_bin):
    model, task, _ = build(tiny_bin, "transformer_sas_base")
    model.eval()
    pad = task.target_dictionary.pad()
    sample = sample_batch(task, 6)
    tool, _, _ = block_gradient_norms(model, sample, 0.1, pad)
    outputs, keep = block_output_gradients(model, sample, pad)
    for (side, k), out in outputs.items():
        total, count = tool[(side, k, "output")]
        expected = masked_mean(out.grad.norm(dim=-1), keep[side])
        assert float(total / count) == pytest.approx(expected, rel=1e-5), (side, k)
        assert expected > 0

    # per-token norms of a summed loss: batching 6 sentences as 3 + 3 gives the same mean
    ds = task.dataset("valid")
    parts = [block_gradient_norms(model, ds.collater([ds[i] for i in idx]), 0.1, pad)[0] for idx in ([0, 1, 2], [3, 4, 5])]
    for site, (total, count) in tool.items():
        split_mean = sum(float(p[site][0]) for p in parts) / sum(float(p[site][1]) for p in parts)
        assert split_mean == pytest.approx(float(total / count), rel=1e-4), site


@pytest.mark.parametrize(
    "encoder, decoder, extra",
    [
        ("deepnorm", "admin", []),
        ("rezero", "xskip_ln", ["--skip-lambda", "1.5", "--skip-lambda-learned"]),
    ],
)
def test_new_kinds_report_what_they_learn(tiny_bin, encoder, decoder, extra):
    """skip:residual norm ratio ||s*x|| / ||F|| (DeepNorm alpha, Admin omega, learned
    lambda), Admin's mean omega, the mean learned lambda and ReZero's a, over real tokens."""
    model, task, _ = build(tiny_bin, "resnmt_transformer",
                           ["--encoder-residual", encoder, "--decoder-residual", decoder, *extra])
    randomize_norms(model)
    move_connections_off_init(model)
    model.eval()
    enc = model.encoder.layers[1].self_attn_connection
    dec = model.decoder.layers[0].encoder_attn_connection
    seen_enc, h1 = capture_inputs(enc)
    seen_dec, h2 = capture_inputs(dec)
    with torch.no_grad():
        means, keep_enc, keep_dec = collect(model, sample_batch(task, 6))
    h1.remove(), h2.remove()

    def norm_ratio(scale, seen, keep):
        x, fx = (t.double() for t in seen["inputs"])
        return masked_mean((scale * x).norm(dim=-1) / fx.norm(dim=-1), keep)

    enc_site, dec_site = ("encoder", 1, "self"), ("decoder", 0, "cross")
    if encoder == "deepnorm":
        n, m = 2, 2  # TINY
        assert enc.alpha == pytest.approx(0.81 * (n ** 4 * m) ** (1 / 16))
        assert means["skip_ratio"][enc_site] == pytest.approx(norm_ratio(enc.alpha, seen_enc, keep_enc), rel=1e-5)
        omega = dec.skip_scale.detach().double()
        assert means["admin_omega"][dec_site] == pytest.approx(float(omega.mean()), rel=1e-6)
        assert means["skip_ratio"][dec_site] == pytest.approx(norm_ratio(omega, seen_dec, keep_dec), rel=1e-5)
        assert "admin_omega" not in {name for name, sites in means.items() if enc_site in sites}
    else:
        a = float(enc.residual_weight.detach())
        assert a != 0 and means["rezero_a"][enc_site] == pytest.approx(a, rel=1e-6)
        lam = dec.skip_scale.detach().double()
        assert means["skip_lambda"][dec_site] == pytest.approx(float(lam.mean()), rel=1e-6)
        assert means["skip_ratio"][dec_site] == pytest.approx(norm_ratio(lam, seen_dec, keep_dec), rel=1e-5)
        assert len(means["rezero_a"]) == 4 and len(means["skip_lambda"]) == 6


def count_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_building_a_model_attaches_no_hooks_the_training_logger_does(tiny_bin):
    off, _, args = build(tiny_bin, "transformer_sas_base")
    assert getattr(args, "log_connection_stats", None) is None
    assert count_hooks(off) == 0
    on, task, args = build(tiny_bin, "transformer_sas_base",
                           ["--log-connection-stats", "--task", "resnmt_translation"])
    assert args.log_connection_stats == "side"
    assert count_hooks(on) == 0  # building never attaches them
    task.begin_epoch(1, on)  # what fairseq's trainer calls when training begins
    # 10 SAS connections + 4 layers' padding-mask pre-hooks
    assert count_hooks(on) == 14
    task.begin_epoch(2, on)
    assert count_hooks(on) == 14  # once
    other, _, _ = build(tiny_bin, "transformer_sas_base")
    collector = attach_training_logger(other, None)
    assert collector is None and count_hooks(other) == 0


def test_log_connection_stats_needs_the_task_that_attaches_them(tiny_bin, capsys):
    with pytest.raises(SystemExit) as err:
        build(tiny_bin, "transformer_sas_base", ["--log-connection-stats"])
    assert err.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--log-connection-stats needs --task resnmt_translation (got --task translation)" in last


# ------------------------------------------------------------------ tiny trained checkpoints

def train_cmd(data, save_dir, arch, *extra):
    return [
        "fairseq-train", data, "--user-dir", USER_DIR, "--arch", arch, *TINY,
        "--share-all-embeddings", "--optimizer", "adam", "--lr", "5e-4", "--max-tokens", "800",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--save-dir", save_dir, "--no-progress-bar", "--log-format", "json", "--log-interval", "1",
        "--seed", "1", "--num-workers", "0", "--max-update", "3", "--no-epoch-checkpoints", *extra,
    ]


@pytest.fixture(scope="module")
def trained(tiny_bin, tmp_path_factory):
    """Five short fairseq-train runs, side by side: an SAS+NReLU model logging per-layer
    statistics, an Admin-encoder/ReZero-decoder model logging per side, a post-LN model
    without the flag, and a DLCL (pre-norm encoder, post-norm decoder with a window)
    model, and a pre-LN model with DyT; trained once per test run. {name: (save_dir, log text)}."""
    jobs = {
        "sas": ("transformer_sas_base", "--normalized-activation", "nrelu", "--log-connection-stats", "layer",
                "--task", "resnmt_translation"),
        "admin_rezero": ("transformer_admin_base", "--decoder-residual", "rezero", "--log-connection-stats",
                         "--task", "resnmt_translation"),
        "postln": ("transformer_postln_base",),
        "dlcl": ("transformer_dlcl_base", "--decoder-residual", "dlcl_post", "--dlcl-window", "2"),
        "dyt": ("transformer_preln_base", "--normalization", "dyt"),
    }

    def train_all(root):  # one after the other, each forked (conftest.forked)
        for name, (arch, *extra) in jobs.items():
            cmd = [str(a) for a in train_cmd(tiny_bin, root / name, arch, *extra)]
            proc = forked(cmd, REPO_ROOT, 600, cli_env(), merge_stderr=True)
            assert proc.returncode == 0, proc.stdout[-4000:]
            (root / f"{name}.log").write_text(proc.stdout, encoding="utf-8")

    root = built_once(tmp_path_factory, "analysis_trained", train_all)
    return {name: (root / name, (root / f"{name}.log").read_text(encoding="utf-8")) for name in jobs}


def json_records(log, tag):
    """The JSON stats fairseq logged under ``tag`` (train_inner, train, valid)."""
    return [json.loads(m.group(1)) for m in re.finditer(rf"\| {tag} \| (\{{.*\}})$", log, re.M)]


def test_training_log_has_side_and_layer_statistics(trained):
    _, log = trained["sas"]
    inner = json_records(log, "train_inner")
    assert len(inner) == 3
    for rec in inner:
        for key in ("sas_alpha_enc", "sas_beta_dec", "sas_gamma_enc", "act_rho_enc", "act_rhop_dec", "act_lambda_dec",
                    "sas_alpha_enc0_self", "sas_beta_dec1_cross", "sas_gamma_dec0_ffn", "act_lambda_dec1"):
            assert key in rec, key
        assert all(0 < float(rec[k]) < 1 for k in rec if k.startswith("sas_"))
        assert float(rec["act_lambda_enc"]) > 1  # lambda >= 1 whenever rho, rho' <= 1
        # the side key is the mean over that side's sublayers (rounded to 3 digits in the log)
        per_layer = [float(rec[f"sas_alpha_enc{i}_{s}"]) for i in range(2) for s in ("self", "ffn")]
        assert float(rec["sas_alpha_enc"]) == pytest.approx(sum(per_layer) / 4, abs=2e-3)
    for rec in json_records(log, "valid"):  # measured in training only
        assert not any(k.startswith(("sas_", "act_")) for k in rec)


def test_training_log_of_admin_and_rezero(trained):
    _, log = trained["admin_rezero"]
    inner = json_records(log, "train_inner")
    assert len(inner) == 3
    for rec in inner:
        assert {"admin_omega_enc", "skip_ratio_enc", "rezero_a_dec"} <= set(rec), sorted(rec)
        assert not any(k.endswith("_dec") and k.startswith(("admin_", "skip_")) for k in rec)
        # N = 2: omega starts at sqrt(5 / ln 5 - 1) = sqrt(2.10667) = 1.4514 and has moved by at most 3 Adam steps
        assert float(rec["admin_omega_enc"]) == pytest.approx(1.4514, abs=3 * 5e-4 + 1e-3)
    assert float(inner[0]["rezero_a_dec"]) == 0.0  # logged in the first forward, before any update
    assert all(abs(float(rec["rezero_a_dec"])) <= 2 * 5e-4 + 5e-4 for rec in inner)  # <= 2 Adam steps of lr 5e-4


def test_a_checkpoint_trained_with_the_flag_loads_without_hooks(trained):
    save_dir, _ = trained["sas"]
    models, cfg, _task = checkpoint_utils.load_model_ensemble_and_task([str(save_dir / "checkpoint_last.pt")])
    assert cfg.model.log_connection_stats == "layer"  # stored, and still no reason to attach
    assert count_hooks(models[0]) == 0


def test_training_log_without_the_flag_has_no_statistics(trained):
    _, log = trained["postln"]
    inner = json_records(log, "train_inner")
    assert len(inner) == 3 and "loss" in inner[0]
    assert not any(k.startswith(("sas_", "act_", "rskip_", "hw_")) for rec in inner for k in rec)


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert len(data) > 5000, f"{path} is suspiciously small ({len(data)} bytes)"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_analyze_sas_checkpoint_matches_a_direct_computation(trained, tiny_bin, tmp_path, capsys):
    save_dir, _ = trained["sas"]
    ckpt = save_dir / "checkpoint_last.pt"
    out = tmp_path / "out"
    rc = analyze_main([str(ckpt), "--data", str(tiny_bin), "--split", "valid", "--num-sentences", "20",
                       "--batch-size", "7", "--out", str(out), "--no-progress-bar"])
    assert rc == 0
    result = json.loads((out / "analysis.json").read_text())
    stats = result["statistics"]
    assert result["arch"] == "transformer_sas_base" and result["num_sentences"] == 20
    assert result["loss"]["label_smoothing"] == 0.1  # taken from the checkpoint
    assert set(stats) == {"sas_alpha", "sas_beta", "sas_gamma", "act_rho", "act_rho_prime", "act_lambda", "grad_norm"}
    assert set(stats["sas_alpha"]["decoder"]) == {"self", "cross", "ffn"}
    assert len(stats["grad_norm"]["encoder"]["output"]) == 2

    # direct: the 20 sentences in one batch, alpha of encoder layer 1's FFN by hand
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(ckpt)], arg_overrides={"data": str(tiny_bin)})
    model = models[0].eval()
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(20)])
    conn = model.encoder.layers[1].ffn_connection
    seen, handle = capture_inputs(conn)
    with torch.no_grad():
        model(**sample["net_input"])
    handle.remove()
    z = torch.cat(seen["inputs"], dim=-1)
    with torch.no_grad():
        alpha = sas_gate_by_hand(conn.gates, z, 0)
    keep = sample["net_input"]["src_tokens"].ne(task.source_dictionary.pad()).t()
    assert stats["sas_alpha"]["encoder"]["ffn"][1] == pytest.approx(masked_mean(alpha, keep), abs=1e-6)

    for name in stats:
        assert png_size(out / f"{name}.png") == (900, 360)
    printed = capsys.readouterr().out
    assert "no gates" not in printed and "sas_alpha" in printed


def test_analyze_console_script_on_post_ln_writes_only_the_gradient_plot(trained, tiny_bin, tmp_path):
    save_dir, _ = trained["postln"]
    out = tmp_path / "out"
    proc = run_cli(["resnmt-analyze", save_dir / "checkpoint_last.pt", "--data", tiny_bin, "--split",
                    "test", "--num-sentences", "8", "--out", out])
    assert "no gates in this model (post_ln): skipping gate plots" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["analysis.json", "grad_norm.png"]
    assert set(json.loads((out / "analysis.json").read_text())["statistics"]) == {"grad_norm"}
    png_size(out / "grad_norm.png")
    assert "resnmt-analyze" in proc.stderr  # the tqdm progress bar


def test_analyze_admin_rezero_checkpoint_reports_omega_ratio_and_a(trained, tiny_bin, tmp_path):
    save_dir, _ = trained["admin_rezero"]
    out = tmp_path / "out"
    assert analyze_main([str(save_dir / "checkpoint_last.pt"), "--data", str(tiny_bin), "--split", "valid",
                         "--num-sentences", "12", "--out", str(out), "--no-progress-bar"]) == 0
    result = json.loads((out / "analysis.json").read_text())
    stats = result["statistics"]
    assert result["connections"] == {"encoder": "admin", "decoder": "rezero"}
    assert set(stats) == {"skip_ratio", "admin_omega", "rezero_a", "grad_norm"}
    assert set(stats["admin_omega"]) == {"encoder"} and set(stats["rezero_a"]) == {"decoder"}
    assert all(abs(v - 1.4514) < 3e-3 for v in stats["admin_omega"]["encoder"]["ffn"])  # omega0 for N = 2
    assert all(abs(v) < 2e-3 for v in stats["rezero_a"]["decoder"]["cross"])  # a from 0, 3 updates
    assert result["descriptions"]["admin_omega"].startswith("Admin omega")
    for name in stats:
        assert png_size(out / f"{name}.png") == (900, 360)


@pytest.mark.parametrize("what", ["checkpoint", "data", "split"])
def test_bad_paths_give_one_line_and_exit_1(trained, tiny_bin, tmp_path, capsys, what):
    ckpt = trained["postln"][0] / "checkpoint_last.pt"
    args = {"checkpoint": str(ckpt), "--data": str(tiny_bin), "--split": "test"}
    expected = {
        "checkpoint": f"resnmt-analyze: error: checkpoint {tmp_path / 'nope.pt'} not found",
        "data": f"resnmt-analyze: error: --data {tmp_path / 'nodata'}: no such directory",
        "split": f"resnmt-analyze: error: split 'tst' not found in {tiny_bin} (splits there: test, train, valid)",
    }[what]
    args.update({"checkpoint": str(tmp_path / "nope.pt")} if what == "checkpoint" else
                {"--data": str(tmp_path / "nodata")} if what == "data" else {"--split": "tst"})
    argv = [args.pop("checkpoint")] + [s for kv in args.items() for s in kv] + ["--out", str(tmp_path / "out")]
    capsys.readouterr()
    assert analyze_main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(expected), err
    assert not (tmp_path / "out").exists()


def test_analyze_dlcl_checkpoint_reports_and_draws_the_combination_weights(trained, tiny_bin, tmp_path):
    """The weights as trained (3 updates moved them off the average), with the cells
    outside the decoder's window of 2 at 0, and their heat map."""
    save_dir, _ = trained["dlcl"]
    ckpt = save_dir / "checkpoint_last.pt"
    out = tmp_path / "out"
    assert analyze_main([str(ckpt), "--data", str(tiny_bin), "--split", "valid", "--num-sentences", "8",
                         "--out", str(out), "--no-progress-bar"]) == 0
    result = json.loads((out / "analysis.json").read_text())
    assert result["connections"] == {"encoder": "dlcl", "decoder": "dlcl_post"}
    weights = result["streams"]["dlcl_weights"]
    state = torch.load(ckpt, weights_only=False)["model"]
    for side in ("encoder", "decoder"):
        trained_w = state[f"{side}.residual_stream.weights"]
        assert torch.tensor(weights[side]).shape == (3, 3)  # 2 layers: rows 0, 1 and the output
        assert not torch.allclose(trained_w.tril(), torch.tensor([[1, 0, 0], [.5, .5, 0], [1 / 3, 1 / 3, 1 / 3]]))
    torch.testing.assert_close(torch.tensor(weights["encoder"]), state["encoder.residual_stream.weights"].tril())
    assert weights["decoder"][2][0] == 0 and weights["decoder"][2][1] == pytest.approx(
        float(state["decoder.residual_stream.weights"][2, 1]))
    assert set(result["statistics"]) == {"grad_norm"}
    assert png_size(out / "dlcl_weights.png") == (920, 400)


def test_analyze_dyt_checkpoint_reports_and_draws_each_learned_alpha(trained, tiny_bin, tmp_path):
    """Every DyT norm's alpha as trained (3 updates moved each off 0.5), per layer and
    sublayer, the stacks' final norms as one value, and their plot."""
    save_dir, _ = trained["dyt"]
    ckpt = save_dir / "checkpoint_last.pt"
    out = tmp_path / "out"
    assert analyze_main([str(ckpt), "--data", str(tiny_bin), "--num-sentences", "8", "--out", str(out),
                         "--no-progress-bar"]) == 0
    alphas = json.loads((out / "analysis.json").read_text())["norms"]["dyt_alpha"]
    state = torch.load(ckpt, weights_only=False)["model"]
    stored = {k: float(v) for k, v in state.items() if k.endswith(".alpha")}
    assert len(stored) == 2 * 2 + 3 * 2 + 2  # two sublayers per encoder layer, three per decoder layer, two final
    reported = {}
    for side, places in alphas.items():
        reported.update({f"{side}.{where}.alpha": v for where, v in places["stack"].items()})
        for where, values in places["layers"].items():
            reported.update({f"{side}.layers.{i}.{where}.alpha": v for i, v in enumerate(values)})
    assert reported == pytest.approx(stored)
    assert all(v != 0.5 for v in stored.values())
    assert png_size(out / "dyt_alpha.png") == (920, 360)


def test_analyze_reports_no_norm_scalars_without_dyt(trained, tiny_bin, tmp_path):
    out = tmp_path / "out"
    assert analyze_main([str(trained["dlcl"][0] / "checkpoint_last.pt"), "--data", str(tiny_bin),
                         "--num-sentences", "4", "--out", str(out), "--no-progress-bar"]) == 0
    assert json.loads((out / "analysis.json").read_text())["norms"] == {}
    assert not (out / "dyt_alpha.png").exists()
