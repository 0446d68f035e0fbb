#!/usr/bin/env bash
# Prepare wmt14-en-de for fairseq (see docs/data-prep.md, or --help); the work is data-prep/prepare.py.
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/prepare.py" wmt14-en-de "$@"
