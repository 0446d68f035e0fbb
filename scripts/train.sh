#!/usr/bin/env bash
# Train one model with the papers' presets: scripts/train.sh --help. The presets live in
# resnmt/experiment/presets.py (plan_training); this wrapper only starts them.
RESNMT_PROG=scripts/train.sh exec "${PYTHON:-$(command -v python || command -v python3)}" -m resnmt.cli.experiment train "$@"
