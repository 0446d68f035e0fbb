#!/usr/bin/env bash
# Prepare multi30k-en-fr for fairseq: the same as `resnmt-prepare multi30k-en-fr` (--help; docs/data-prep.md).
exec bash "$(dirname "${BASH_SOURCE[0]}")/prepare.sh" multi30k-en-fr "$@"
