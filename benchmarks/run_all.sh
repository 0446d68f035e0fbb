#!/usr/bin/env bash
# Run the speed/memory benchmark and the quality runs with their defaults, then rebuild
# the tables in docs/benchmarks.md. Needs data/multi30k (prepared here if missing).
#
#   bash benchmarks/run_all.sh            # CPU: speed (3 interleaved rounds) + every quality run not yet done
#   bash benchmarks/run_all.sh --device cuda
#   SPEED_ARGS="--rounds 5" QUALITY_ARGS="--max-runs 4" bash benchmarks/run_all.sh
set -euo pipefail

usage() {
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
    echo "options: --device cpu|cuda (speed only; quality always runs on the CPU), --skip-speed, --skip-quality, -h/--help"
    echo "env: SPEED_ARGS, QUALITY_ARGS (extra options, see python benchmarks/speed.py --help / quality.py --help);"
    echo "     MULTI30K_MIRROR=DIR prepares Multi30k from a local copy of the published files instead of the network"
}

DEVICE=cpu
RUN_SPEED=1
RUN_QUALITY=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --device) DEVICE="${2:?--device needs cpu or cuda}"; shift 2 ;;
        --skip-speed) RUN_SPEED=0; shift ;;
        --skip-quality) RUN_QUALITY=0; shift ;;
        *) echo "run_all.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
if [[ ! -d data/multi30k/bin ]]; then
    bash data-prep/prepare-multi30k.sh ${MULTI30K_MIRROR:+--mirror "$MULTI30K_MIRROR"} data/multi30k
fi
# shellcheck disable=SC2086  # word splitting of the extra options is intended
if [[ $RUN_SPEED == 1 ]]; then
    "$PYTHON" benchmarks/speed.py --device "$DEVICE" ${SPEED_ARGS:-}
fi
# shellcheck disable=SC2086
if [[ $RUN_QUALITY == 1 ]]; then
    "$PYTHON" benchmarks/quality.py ${QUALITY_ARGS:-}
fi
"$PYTHON" benchmarks/make_tables.py --write docs/benchmarks.md --write docs/study.md --write docs/study-results.md --write README.md
