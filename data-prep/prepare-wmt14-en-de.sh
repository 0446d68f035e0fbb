#!/usr/bin/env bash
# Prepare wmt14-en-de for fairseq: the same as `resnmt-prepare wmt14-en-de` (--help; docs/data-prep.md).
exec bash "$(dirname "${BASH_SOURCE[0]}")/prepare.sh" wmt14-en-de "$@"
