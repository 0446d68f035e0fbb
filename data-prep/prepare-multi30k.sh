#!/usr/bin/env bash
# Prepare multi30k for fairseq: the same as `resnmt-prepare multi30k` (--help; docs/data-prep.md).
exec bash "$(dirname "${BASH_SOURCE[0]}")/prepare.sh" multi30k "$@"
