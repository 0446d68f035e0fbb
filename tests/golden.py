"""The golden run: every model configuration the suite builds, its numbers saved and compared.

A change meant to leave the numbers alone (a rename, a split function, a moved module) is
checked by running this before it and after it::

    python tests/golden.py save /tmp/golden-before.pt      # on the commit before the change
    python tests/golden.py compare /tmp/golden-before.pt   # after: exit 1 on any difference

For every connection kind (its defaults), every named arch (with the suite's tiny sizes),
the flag combinations of the fixture checkpoints (built fresh) and the fixture
checkpoints themselves (loaded), it builds the model with a fixed seed, runs one forward
and backward in training mode (dropout on, seeded) on a fixed batch and keeps the logits
and every parameter's gradient by name; ``compare`` requires the same names and
``torch.equal`` values.
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_utils import build  # noqa: E402
from old_checkpoints import CHECKPOINTS, FIXTURES, fixed_batch, load  # noqa: E402

from resnmt.connections import CONNECTION_CLASSES  # noqa: E402
from resnmt.models.architectures import FAMILIES  # noqa: E402

DATA = ["--source-lang", "en", "--target-lang", "de"]
# flag values the suite sets beside each kind's defaults (variants of a kind's form)
VARIANTS = {
    "xskip_learned": ["--residual", "xskip", "--skip-lambda-learned"],
    "sas_single_gate_dim": ["--residual", "sas", "--sas-gate", "single_layer", "--sas-gate-dim", "8"],
    "admin_o1": ["--residual", "admin", "--admin-output-change-scale", "O(1)"],
    "b2t_rescale": ["--residual", "b2t", "--b2t-rescale-init"],
    "hyper_static_unscaled": ["--residual", "hyper", "--hc-no-init-scaling", "--hc-streams", "2"],
    "mhc_iterations": ["--residual", "mhc", "--mhc-sinkhorn-iterations", "3"],
    "pre_ln_rms_norm": ["--residual", "pre_ln", "--normalization", "rms_norm"],
    "sas_dyt": ["--residual", "sas", "--normalization", "dyt", "--dyt-alpha-init", "0.8"],
    "dlcl_window": ["--residual", "dlcl", "--encoder-layers", "3", "--dlcl-window", "2"],
    "resi_dual_alpha": ["--residual", "resi_dual", "--resi-dual-scale", "0.5", "--resi-dual-alpha", "0.7"],
    "decoder_normalize_before": ["--decoder-normalize-before"],
    "no_decoder_final_norm": ["--residual", "pre_ln", "--no-decoder-final-norm"],
}


def configurations():
    """name -> (arch, flags)."""
    configs = {f"kind:{kind}": ("resnmt_transformer", ["--residual", kind]) for kind in CONNECTION_CLASSES}
    configs.update({f"arch:{family}_{size}": (f"transformer_{family}_{size}", [])
                    for family in FAMILIES for size in ("base", "big")})
    configs.update({f"fixture-flags:{name}": ("resnmt_transformer", flags) for name, flags in CHECKPOINTS.items()})
    configs.update({f"variant:{name}": ("resnmt_transformer", flags) for name, flags in VARIANTS.items()})
    return configs


def forward_backward(model, batch):
    """Logits and gradients by parameter name of one training-mode step on ``batch``."""
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1234)
    logits = model(**batch)[0]
    (logits.float().pow(2).mean() + logits.float().mean()).backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    return {"logits": logits.detach().clone(), "grads": grads,
            "state_dict_keys": sorted(model.state_dict())}


def run_all():
    results = {}
    for name, (arch, flags) in configurations().items():
        model, _task, _args = build(FIXTURES, arch, [*DATA, *flags, "--dropout", "0.1"], seed=1)
        results[name] = forward_backward(model, fixed_batch(model))
        print(name, "ok", flush=True)
    for name in CHECKPOINTS:
        model = load(FIXTURES / f"{name}.pt")
        results[f"checkpoint:{name}"] = forward_backward(model, fixed_batch(model))
        model.eval()
        with torch.no_grad():
            results[f"checkpoint:{name}"]["eval_logits"] = model(**fixed_batch(model))[0]
        print(f"checkpoint:{name}", "ok", flush=True)
    return results


def differences(before, after):
    """One line per difference between two golden runs (none: identical)."""
    problems = [f"{name}: missing after" for name in before if name not in after]
    problems += [f"{name}: new after" for name in after if name not in before]
    for name in before.keys() & after.keys():
        b, a = before[name], after[name]
        for key in ("logits", "eval_logits"):
            if key in b and not torch.equal(b[key], a.get(key)):
                problems.append(f"{name}: {key} differ")
        if b["state_dict_keys"] != a["state_dict_keys"]:
            problems.append(f"{name}: state dict keys differ")
        if b["grads"].keys() != a["grads"].keys():
            problems.append(f"{name}: gradient names differ")
        problems += [f"{name}: gradient of {p} differs" for p in b["grads"]
                     if p in a["grads"] and not torch.equal(b["grads"][p], a["grads"][p])]
    return sorted(problems)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("save", "compare"))
    parser.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = run_all()
    if args.action == "save":
        torch.save(results, args.path)
        print(f"saved {len(results)} configurations to {args.path}")
        return 0
    problems = differences(torch.load(args.path, weights_only=False), results)
    print("\n".join(problems) or f"identical: {len(results)} configurations (logits, gradients, state dict keys)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
