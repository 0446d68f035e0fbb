#!/usr/bin/env bash
# One experiment end to end (prepare -> train -> average -> decode -> score):
# scripts/run_experiment.sh --help, the same as resnmt-experiment. The pipeline lives in
# resnmt/experiment/pipeline.py (Experiment); this wrapper only starts it.
RESNMT_PROG=scripts/run_experiment.sh exec "${PYTHON:-$(command -v python || command -v python3)}" -m resnmt.cli.experiment run "$@"
