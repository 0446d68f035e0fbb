"""Print the named architectures with their parameter counts (a markdown table).

    python -m resnmt.cli.arch_table [--vocab 32000]

Models are built through fairseq's real argument parsing with a joined dictionary of
``--vocab`` entries and ``--share-all-embeddings``; no data is needed.
"""
import argparse

import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.tasks.translation import TranslationTask

import resnmt  # noqa: F401
from resnmt.connections import CONNECTION_CLASSES
from resnmt.models.architectures import ARCHS
from resnmt.options import Option, add_to_command

VOCAB = Option("vocab", 32000, "joined dictionary size (default: %(default)s)", kind="int", minimum=1)


def dictionary(size: int) -> Dictionary:
    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}")
    return d


def build(arch: str, vocab: Dictionary, extra=()):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["/dev/null", "--arch", arch, "--share-all-embeddings", *extra])
    task = TranslationTask(args, vocab, vocab)
    with torch.device("meta"):  # shapes only: no memory, no init time
        return task.build_model(args)


def count(model, exclude_embeddings=False) -> int:
    params = dict(model.named_parameters())
    return sum(p.numel() for name, p in params.items() if not (exclude_embeddings and "embed_tokens" in name))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to_command(parser, (VOCAB,))
    args = parser.parse_args(argv)
    vocab = dictionary(args.vocab)
    print(f"| arch | connection | parameters (vocab {args.vocab:,}, shared embeddings) | without embeddings |")
    print("|---|---|---:|---:|")
    rows = [(name, ()) for name in ARCHS] + [("transformer_sas_base", ("--sas-gate-dim", "64"))]
    for name, extra in rows:
        model = build(name, vocab, extra)
        spec = model.encoder.connection_spec
        kind = spec.kind + "".join(  # the values the arch chooses, e.g. "(lambda 2)"
            f" ({dest.replace('skip_', '')} {getattr(spec, dest):g})" for dest in CONNECTION_CLASSES[spec.kind].arch_options
        )
        label = name + (" " + " ".join(extra) if extra else "")
        print(f"| `{label}` | {kind} | {count(model) / 1e6:.1f}M | {count(model, True) / 1e6:.1f}M |")


if __name__ == "__main__":
    main()
