#!/usr/bin/env bash
# data-prep/prepare.sh DATASET [options] OUTDIR: resnmt-prepare from a checkout, with the
# Python in $PYTHON (default: python3 on PATH). The work is in the package (resnmt/data/).
PY="${PYTHON:-python3}"
missing=$("$PY" -c 'import importlib.util as u; print(*(m for m in ("resnmt", "torch", "fairseq") if u.find_spec(m) is None))' 2>/dev/null) || missing="(none runs)"
if [[ -n "$missing" ]]; then
    echo "[prepare-$1] error: python module(s) missing in $PY: $missing (install resnmt: make venv, or pip install .; or set PYTHON=/path/to/venv/bin/python)" >&2
    exit 1
fi
exec "$PY" -m resnmt.cli.prepare "$@"
