#!/usr/bin/env bash
# Prepare iwslt15-en-vi for fairseq: the same as `resnmt-prepare iwslt15-en-vi` (--help; docs/data-prep.md).
exec bash "$(dirname "${BASH_SOURCE[0]}")/prepare.sh" iwslt15-en-vi "$@"
