"""``--compile-layers`` (resnmt/training/compile.py): the layers compiled for training compute the
eager layers' function, compile once for all batch shapes, and leave evaluation eager.

The default suite traces post-LN with torch.compile's ``aot_eager`` backend (Dynamo and AOT
autograd, the graphs that inductor would generate code from, without the code
generation, which takes minutes on a small CPU); the slow tests add SAS with batch-mode
NSwish and ReZero, and train SAS with inductor,
and the GPU job runs it on CUDA in the recipe row of benchmarks/gpu_train.py.
"""
import pytest
import torch
import torch._dynamo

from conftest import REPO_ROOT, run_cli
from model_utils import TINY, assert_incremental_equals_full, build, move_connections_off_init, randomize_norms
from resnmt.training.compile import compile_layers_for_training, compiled_calls
from test_bf16 import write_resnmt_train_probe
from test_distributed import ARCHS, probe_train_args, read_losses

NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
CASES = {
    "post_ln": ("transformer_postln_base", []),
    "sas_nswish_batch": ("transformer_sas_base", ["--normalized-activation", "nswish",
                                                  "--normalized-activation-stats", "batch"]),
    "rezero": ("transformer_rezero_base", []),
}
SLOW_CASES = {"sas_nswish_batch", "rezero"}  # tracing them takes 20-40 s each on a small CPU
POST_LN = ["--arch", "transformer_postln_base"]


def training_batches(task, sizes=(3, 7, 12)):
    """Batches of different shapes (sentences, lengths)."""
    task.load_dataset("train")
    ds = task.dataset("train")
    out, start = [], 0
    for n in sizes:
        out.append(ds.collater([ds[i] for i in range(start, start + n)]))
        start += n
    return out


def loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    out = model(**batch["net_input"])[0]
    loss = torch.nn.functional.cross_entropy(out.transpose(1, 2), batch["target"], ignore_index=1)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in sorted(CASES)])
def test_compiled_layers_train_like_eager_and_compile_once(tiny_bin, case):
    arch, extra = CASES[case]
    eager, task, _ = build(tiny_bin, arch, [*extra, *NO_DROPOUT])
    compiled, _, _ = build(tiny_bin, arch, [*extra, *NO_DROPOUT])
    for m in (eager, compiled):
        randomize_norms(m)
        move_connections_off_init(m)
    assert compile_layers_for_training(compiled, backend="aot_eager") == 4  # 2 encoder + 2 decoder layers
    assert compile_layers_for_training(compiled, backend="aot_eager") == 4  # again: nothing changes
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager.train(), compiled.train()
    graphs = []
    for batch in training_batches(task):
        loss_e, grads_e = loss_and_grads(eager, batch)
        loss_c, grads_c = loss_and_grads(compiled, batch)
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-6, atol=1e-6)
        assert grads_c.keys() == grads_e.keys() and grads_e
        for name in grads_e:
            torch.testing.assert_close(grads_c[name], grads_e[name], rtol=1e-5, atol=1e-6, msg=name)
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    assert graphs[0] > 0 and graphs[1:] == [graphs[0]] * 2, graphs  # new shapes: no recompilation
    assert compiled_calls(compiled) == 4 * 3
    for (name, b_e), b_c in zip(eager.named_buffers(), compiled.buffers()):  # NSwish's running estimates
        torch.testing.assert_close(b_c, b_e, rtol=1e-6, atol=1e-6, msg=name)

    # evaluation and incremental decoding run eagerly
    compiled.eval()
    assert_incremental_equals_full(compiled, task)
    with torch.no_grad():
        compiled.train()
        compiled(**training_batches(task, sizes=(2,))[0]["net_input"])
    assert compiled_calls(compiled) == 4 * 3


# on CUDA: inductor's kernels, and with --compile-mode reduce-overhead each layer replayed as a
# CUDA graph (the batches seen three times: recorded, then replayed)
CUDA_CASES = {"inductor": ("transformer_sas_base", "default", 1),
              "cuda_graphs": ("transformer_postln_base", "reduce-overhead", 3)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu_job.sh 3 runs it)")
@pytest.mark.parametrize("case", list(CUDA_CASES))
def test_on_cuda_trains_like_eager(tiny_bin, case):
    """The same losses and gradients as eager, over batches of three shapes."""
    from fairseq import utils as fairseq_utils

    arch, mode, passes = CUDA_CASES[case]
    eager, task, _ = build(tiny_bin, arch, NO_DROPOUT)
    compiled, _, _ = build(tiny_bin, arch, NO_DROPOUT)
    eager.cuda().train(), compiled.cuda().train()
    compile_layers_for_training(compiled, mode=mode)
    for batch in training_batches(task) * passes:
        batch = fairseq_utils.move_to_cuda(batch)
        torch.compiler.cudagraph_mark_step_begin()  # as the task does before each update
        loss_e, grads_e = loss_and_grads(eager, batch)
        loss_c, grads_c = loss_and_grads(compiled, batch)
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-4, atol=1e-5)
        for name in grads_e:
            torch.testing.assert_close(grads_c[name], grads_e[name], rtol=1e-3, atol=1e-5, msg=name)
    assert compiled_calls(compiled) == 4 * 3 * passes


def test_compile_layers_with_connection_stats_is_refused(tiny_bin):
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        str(tiny_bin), "--task", "resnmt_translation", "--arch", "transformer_sas_base", *TINY, "--compile-layers",
        "--log-connection-stats"])
    task = tasks.setup_task(args)
    with pytest.raises(ValueError, match=r"^--compile-layers with --log-connection-stats: the statistics hooks"):
        task.build_model(args)


def test_unknown_backend_is_refused(tiny_bin):
    model, _, _ = build(tiny_bin, "transformer_postln_base")
    with pytest.raises(ValueError, match=r"^--compile-backend cuda: choose one of inductor, aot_eager, eager$"):
        compile_layers_for_training(model, backend="cuda")


def fairseq_train_losses(tmp_path, tiny_bin, name, *extra, arch=POST_LN, updates=3):
    probe = write_resnmt_train_probe(tmp_path)
    args = probe_train_args(probe, tiny_bin, tmp_path / name, arch, "--max-update", str(updates),
                            "--no-save", *extra)
    proc = run_cli(args, PROBE_OUT=str(tmp_path / f"{name}_probe"))
    return read_losses(tmp_path / f"{name}_probe" / "loss.rank0.jsonl"), proc


def test_resnmt_train_with_compile_layers(tiny_bin, tmp_path):
    eager, _ = fairseq_train_losses(tmp_path, tiny_bin, "eager")
    # the plumbing: flag, task, compiled layers in fairseq-train (Dynamo alone: the graphs are
    # checked against eager with AOT autograd above, and with inductor in the slow test)
    compiled, proc = fairseq_train_losses(tmp_path, tiny_bin, "compiled", "--compile-layers",
                                          "--compile-backend", "eager")
    assert sorted(compiled) == sorted(eager) == [1, 2, 3]
    assert "--compile-layers: 4 layers compiled for training" in proc.stdout + proc.stderr
    for update, loss in eager.items():
        assert compiled[update] == pytest.approx(loss, rel=1e-5, abs=1e-6), update


@pytest.mark.slow
def test_resnmt_train_with_compile_layers_inductor(tiny_bin, tmp_path):
    """inductor's generated kernels (minutes of compilation on a small CPU)."""
    eager, _ = fairseq_train_losses(tmp_path, tiny_bin, "eager", arch=ARCHS["sas"])
    compiled, _ = fairseq_train_losses(tmp_path, tiny_bin, "compiled", "--compile-layers", arch=ARCHS["sas"])
    assert sorted(compiled) == sorted(eager)
    for update, loss in eager.items():
        assert compiled[update] == pytest.approx(loss, rel=1e-4, abs=1e-5), update


def test_compile_flags_need_the_resnmt_task(tiny_bin, tmp_path):
    proc = run_cli(["fairseq-train", tiny_bin, "--user-dir", REPO_ROOT / "resnmt",
                    "--task", "translation", "--arch", "transformer_postln_base", *TINY, "--compile-layers",
                    "--cpu", "--max-tokens", "500", "--save-dir", tmp_path], check=False)
    assert proc.returncode == 2 and "unrecognized arguments: --compile-layers" in proc.stderr  # a task flag


@pytest.mark.parametrize("backend, mode, message", [
    ("aot_eager", "reduce-overhead", "--compile-mode reduce-overhead needs --compile-backend inductor "
                                     "(aot_eager ignores the mode)"),
    ("inductor", "overhead", "--compile-mode overhead: choose one of default, reduce-overhead, "
                             "max-autotune-no-cudagraphs, max-autotune"),
])
def test_bad_compile_mode_is_refused(tiny_bin, backend, mode, message):
    model, _, _ = build(tiny_bin, "transformer_postln_base")
    with pytest.raises(ValueError, match=f"^{message}$".replace("(", r"\(").replace(")", r"\)")):
        compile_layers_for_training(model, backend=backend, mode=mode)


def test_resnmt_train_refuses_compile_mode_without_inductor(tiny_bin, tmp_path):
    proc = run_cli(["resnmt-train", tiny_bin, "--task", "resnmt_translation", "--arch", "transformer_postln_base",
                    *TINY, "--compile-layers", "--compile-backend", "eager", "--compile-mode", "reduce-overhead",
                    "--cpu", "--max-tokens", "500", "--save-dir", tmp_path], check=False)
    assert proc.returncode == 2
    assert ("error: --compile-mode reduce-overhead needs --compile-backend inductor (eager ignores the mode)"
            in proc.stderr.strip().splitlines()[-1])
    assert not list(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize("mode, marks", [("reduce-overhead", 1), ("default", 0)])
def test_each_update_starts_a_cuda_graph_step(tiny_bin, monkeypatch, mode, marks):
    """With CUDA graphs each training update first marks a new step of the graphs (so a replay
    never overwrites outputs the update still holds); without them nothing is marked."""
    from fairseq import options, tasks
    from fairseq.tasks.translation import TranslationTask

    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        str(tiny_bin), "--task", "resnmt_translation", "--arch", "transformer_postln_base", *TINY,
        "--compile-layers", "--compile-mode", mode])
    task = tasks.setup_task(args)
    calls = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append("mark"))
    monkeypatch.setattr(TranslationTask, "train_step", lambda self, *a, **k: calls.append("step") or (0, 1, {}))
    assert task.train_step("sample", "model", "criterion", "optimizer", 0) == (0, 1, {})
    assert calls == ["mark"] * marks + ["step"]


@pytest.mark.slow
def test_resnmt_train_with_cuda_graph_mode_on_cpu(tiny_bin, tmp_path):
    """--compile-mode reduce-overhead through fairseq-train: on the CPU inductor makes no CUDA
    graphs, and the updates are eager's (the CUDA graphs themselves: the CUDA test above)."""
    eager, _ = fairseq_train_losses(tmp_path, tiny_bin, "eager")
    compiled, proc = fairseq_train_losses(tmp_path, tiny_bin, "compiled", "--compile-layers",
                                          "--compile-mode", "reduce-overhead")
    assert "backend inductor, mode reduce-overhead)" in proc.stdout + proc.stderr
    assert sorted(compiled) == sorted(eager) == [1, 2, 3]
    for update, loss in eager.items():
        assert compiled[update] == pytest.approx(loss, rel=1e-4, abs=1e-5), update
