"""Build tiny models through fairseq's real argument parsing (arch functions included)."""
import torch
from fairseq import options, tasks

import resnmt  # noqa: F401  (registers the models)

TINY = [
    "--encoder-layers", "2", "--decoder-layers", "2",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]


def parse_train_args(data_dir, arch, extra=()):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, input_args=[str(data_dir), "--arch", arch, *TINY, *extra])


def build(data_dir, arch, extra=(), seed=1):
    """(model, task, args) for ``arch`` with tiny sizes, deterministic weights."""
    args = parse_train_args(data_dir, arch, extra)
    task = tasks.setup_task(args)
    torch.manual_seed(seed)
    model = task.build_model(args)
    return model, task, args


def sample_batch(task, n=4, split="valid"):
    task.load_dataset(split)
    ds = task.dataset(split)
    return ds.collater([ds[i] for i in range(n)])


def encoder_output_and_input(model, task, n=4):
    """For a stack run by hand: the encoder's own output on ``n`` validation sentences (eval
    mode, no gradients), what fairseq's encoder feeds its first layer (T x B x C), and the
    source padding mask."""
    model.eval()
    net_input = sample_batch(task, n=n)["net_input"]
    encoder = model.encoder
    with torch.no_grad():
        got = encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])["encoder_out"][0]
        x, _ = encoder.forward_embedding(net_input["src_tokens"])
        mask = net_input["src_tokens"].eq(encoder.padding_idx)
        x = (x * (1 - mask.unsqueeze(-1).type_as(x))).transpose(0, 1)
    return got, x, mask


def randomize_norms(model, seed=0):
    """Give LayerNorm gains/biases non-trivial values so equations are really tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(p + 0.3 * torch.randn(p.shape, generator=g))


def move_connections_off_init(model, seed=0):
    """Give learned connection scales (ReZero's a, learned lambda, Admin's omega) and the
    2025 kinds' dynamic weights (DHC's W, mHC's phi, DenseFormer's alpha) non-trivial
    values: ReZero starts at a = 0, where every sublayer is skipped and gets no gradient;
    DHC's and mHC's scales get none while their W/phi are 0; so equations and gradients
    would not really be tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("residual_weight", "skip_scale")):
                p.copy_(p + 0.5 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith(("streams.alpha_weight", "streams.beta_weight", "streams.phi",
                                "residual_stream.average.weights")):
                p.copy_(p + 0.3 * torch.randn(p.shape, generator=g))


def assert_incremental_equals_full(model, task, n=3, atol=1e-5):
    """Step-by-step decoding (fairseq's incremental_state) gives the full forward's
    outputs at every real (non-padding) target position; ``model`` in eval mode."""
    net_input = sample_batch(task, n=n)["net_input"]
    with torch.no_grad():
        full = model(**net_input)[0]
        encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
        state, prev, steps = {}, net_input["prev_output_tokens"], []
        for t in range(prev.size(1)):
            steps.append(model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0])
    real = prev.ne(task.target_dictionary.pad())  # padding positions are never read
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], rtol=0, atol=atol)


def block_output_gradients(model, sample, pad, label_smoothing=0.1):
    """Autograd's reference for resnmt-analyze's gradient norms: ``({(side, layer): output
    with .grad}, {side: non-padding mask (T, B)})`` after one backward of the summed
    label-smoothed NLL of ``sample`` (each layer's first output, whatever its shape)."""
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    outputs = {}
    handles = [layer.register_forward_hook(
        lambda m, i, o, key=(side, k): outputs.__setitem__(key, o[0] if isinstance(o, tuple) else o))
        for side in ("encoder", "decoder") for k, layer in enumerate(getattr(model, side).layers)]
    net_output = model(**sample["net_input"])
    for h in handles:
        h.remove()
    for out in outputs.values():
        out.retain_grad()
    lprobs = model.get_normalized_probs(net_output, log_probs=True)
    loss, _ = label_smoothed_nll_loss(lprobs.view(-1, lprobs.size(-1)), sample["target"].view(-1), label_smoothing,
                                      ignore_index=pad)
    loss.backward()
    keep = {"encoder": sample["net_input"]["src_tokens"].ne(pad).t(), "decoder": sample["target"].ne(pad).t()}
    return outputs, keep
