"""The committed small checkpoints (tests/fixtures/checkpoints) and how they are read."""
from pathlib import Path

import torch
from fairseq import checkpoint_utils

import resnmt  # noqa: F401  (registers the model; allow-lists what fairseq checkpoints hold)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "checkpoints"

# name -> resnmt flags; together they cover every connection kind and the activation buffers
CHECKPOINTS = {
    "post_ln": ["--residual", "post_ln"],
    "pre_ln_sas": ["--encoder-residual", "pre_ln", "--decoder-residual", "sas", "--sas-gamma", "gate"],
    "rskip_highway": ["--encoder-residual", "rskip_ln", "--decoder-residual", "highway", "--skip-lambda", "2"],
    "xskip_ln_xskip_nswish": ["--encoder-residual", "xskip_ln", "--decoder-residual", "xskip", "--skip-lambda", "1.5",
                              "--normalized-activation", "nswish", "--normalized-activation-stats", "batch"],
    "deepnorm_rezero": ["--encoder-residual", "deepnorm", "--decoder-residual", "rezero"],
    "admin_xskip_ln_learned": ["--encoder-residual", "admin", "--decoder-residual", "xskip_ln", "--skip-lambda", "1.5",
                               "--skip-lambda-learned"],
    "b2t_resi_dual": ["--encoder-residual", "b2t", "--decoder-residual", "resi_dual", "--resi-dual-scale", "0.5"],
    "peri_ln_dlcl_rms_norm": ["--encoder-residual", "peri_ln", "--decoder-residual", "dlcl", "--decoder-layers", "2",
                              "--normalization", "rms_norm"],
    "dlcl_post_dyt": ["--residual", "dlcl_post", "--encoder-layers", "3", "--dlcl-window", "2",
                      "--normalization", "dyt"],
    "hyper_dynamic_mhc": ["--encoder-residual", "hyper", "--decoder-residual", "mhc", "--hc-dynamic",
                          "--hc-streams", "3"],
    "mix_ln_ln_scaling": ["--encoder-residual", "mix_ln", "--decoder-residual", "ln_scaling", "--encoder-layers", "2",
                          "--decoder-layers", "2", "--mix-ln-fraction", "0.5"],
    "hybrid_norm_star_denseformer": ["--encoder-residual", "hybrid_norm", "--decoder-residual", "denseformer",
                                     "--hybrid-norm-star", "--encoder-layers", "2", "--decoder-layers", "2"],
}


def load(path: Path):
    models, _cfg, _task = checkpoint_utils.load_model_ensemble_and_task(
        [str(path)], arg_overrides={"data": str(FIXTURES), "source_lang": "en", "target_lang": "de"}, strict=True
    )
    model = models[0]
    model.eval()
    return model


def fixed_batch(model):
    """Source and previous-output tokens drawn from the dictionary, fixed by a seed."""
    vocab = model.encoder.dictionary
    g = torch.Generator().manual_seed(0)
    src = torch.randint(vocab.nspecial, len(vocab), (3, 7), generator=g)
    src[:, -1] = vocab.eos()
    src[0, :2] = vocab.pad()  # left padding, as fairseq batches sources
    prev = torch.randint(vocab.nspecial, len(vocab), (3, 5), generator=g)
    prev[:, 0] = vocab.eos()
    lengths = src.ne(vocab.pad()).sum(1)
    return {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}


def outputs(model, batch):
    with torch.no_grad():
        return {"batch": batch, "logits": model(**batch)[0]}
