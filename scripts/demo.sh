#!/usr/bin/env bash
# The demo (make demo): Multi30k EN-DE, a small post-LN Transformer against the same
# model with 2rSkip+LN connections, trained, averaged, decoded and scored by the pipeline
# of resnmt/experiment/pipeline.py; scripts/demo.sh --help, docs/demo.md.
RESNMT_PROG=scripts/demo.sh exec "${PYTHON:-$(command -v python || command -v python3)}" -m resnmt.cli.demo "$@"
