"""CPU ranks through every launcher a user uses (fairseq's own spawn, torchrun, SLURM),
with each of fairseq's DDP backends: real processes over gloo on 127.0.0.1."""
import torch

from test_distributed import ARCHS, _named_parameters, read_losses, run_two_ranks, write_probe


def test_default_ddp_backend_trains_cpu_ranks(tiny_bin, tmp_path):
    """fairseq's default --ddp-backend (pytorch_ddp) on a CPU module: both ranks train, in lockstep."""
    out = tmp_path / "out"
    run_two_ranks(write_probe(tmp_path), tiny_bin, tmp_path / "ckpt", out, ARCHS["sas"], 3, "--ddp-backend", "pytorch_ddp")
    states = [torch.load(out / f"state.rank{r}.pt", weights_only=True) for r in range(2)]
    assert states[0]["num_updates"] == states[1]["num_updates"] == 3
    for key, value in _named_parameters(states[0]["model"]):
        assert torch.equal(value, states[1]["model"][key]), key
    assert sorted(read_losses(out / "loss.rank0.jsonl")) == [1, 2, 3]
    assert read_losses(out / "loss.rank0.jsonl") == read_losses(out / "loss.rank1.jsonl")
