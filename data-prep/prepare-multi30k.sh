#!/usr/bin/env bash
# Prepare multi30k for fairseq (see docs/data-prep.md, or --help); the work is data-prep/prepare.py.
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/prepare.py" multi30k "$@"
