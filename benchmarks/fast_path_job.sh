#!/usr/bin/env bash
# Issue 55's GPU calls: the fast path (--fast-path, resnmt/training/fast/) on a bare GPU machine
# with Python 3.12 and its own torch, no network, .gpu/ carried (`make gpu-bundle` builds it;
# docs/benchmarks.md, "The GPU job"). One part per device call, each within 9 minutes:
#
#   run(command="bash benchmarks/fast_path_job.sh 1", carry=[".gpu"], timeout_s=570)
#   run(command="bash benchmarks/fast_path_job.sh 2", carry=[".gpu"], timeout_s=570)   # a later call
#
# Part 1 (GPU_JOB_SECONDS, default 540 s):
#   the CUDA checks of tests/test_fast_path.py (the update captured as a CUDA graph equals the
#   eager one bit for bit; the fast path's losses equal fairseq's step; torch's sync debug mode
#   finds no synchronisation in an update but the model's padding checks) -> fast_path_tests.txt;
#   the whole step captured on the tiny corpus against eager, in a process of its own (it fails
#   on the first host read while the model still asks whether a batch holds padding)
#   -> fast_path_capture_test.txt;
#   whole processes, base at 4096 tokens, 3 interleaved rounds of stock fairseq-train --arch
#   transformer --fp16, resnmt-train --fast-path --bf16 and stock again (the noise floor),
#   250 updates each (Multi30k's first epoch is about 135 of them) -> fast_path.jsonl.
# Part 2 (default 540 s): base at 4096 tokens, stock against the fast path without its CUDA
#   graphs (--no-step-capture: what the update without host syncs gives alone), 2 rounds (the
#   noise floor: part 1's, in the same lease); then transformer-big at 16384 tokens, stock,
#   the fast path and stock again, 2 rounds (MFU against the card's measured bf16 rate)
#   -> fast_path.jsonl.
# Each step stops starting new work at its deadline; a process line is written as each ends.
# GPU_JOB_SMOKE=1 rehearses a part on the CPU (tiny model, few updates; the CUDA checks skip),
# where fairseq is already installed; PYTHON names the interpreter (default python3).
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
PART=${1:-1}
case "$PART" in
    1|2) BUDGET=${GPU_JOB_SECONDS:-540} ;;
    *) echo "fast_path_job.sh: part '$PART': give 1 or 2"; exit 2 ;;
esac
T0=$SECONDS
left() { echo $(( BUDGET - (SECONDS - T0) )); }
exec > >(tee -a "$OUT/job.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

PY=${PYTHON:-python3}
SMOKE=()
[ "${GPU_JOB_SMOKE:-0}" = 1 ] && SMOKE=(--smoke --cpu --updates 6 --interval 1 --skip 1 --tokens 1024 --rounds 1)
if ! "$PY" -c "import fairseq" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl \
        || { echo "fast_path_job: installing .gpu/whl failed"; exit 1; }
fi
export PYTHONPATH="/tmp/site:$PWD" PATH="/tmp/site/bin:$PATH" RESNMT_TEST_DATA="$PWD/.gpu/test-data"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
"$PY" -c "import torch, fairseq, resnmt; print('torch', torch.__version__, 'fairseq', fairseq.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA')" \
    || { echo "fast_path_job: fairseq or resnmt does not import"; exit 1; }
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>/dev/null || true
echo "[fast_path_job] part $PART set up in $((SECONDS - T0)) s"
job() { timeout -k 5 "$(left)" "$PY" benchmarks/fast_path_job.py --data .gpu/multi30k/bin --out "$OUT/fast_path.jsonl" "$@"; }

if [ "$PART" = 1 ]; then
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fast_path.py \
        -k "on_cuda and not captured_training" 2>&1 | tail -n 40 > "$OUT/fast_path_tests.txt"
    tail -n 3 "$OUT/fast_path_tests.txt"
    timeout 120 "$PY" -m pytest -q -s -p no:cacheprovider -o addopts="" \
        tests/test_fast_path.py::test_on_cuda_captured_training_equals_eager_training 2>&1 | tail -n 60 > "$OUT/fast_path_capture_test.txt"
    tail -n 2 "$OUT/fast_path_capture_test.txt"
    echo "[fast_path_job] checks done at $((SECONDS - T0)) s"
    job --runs stock,fast,stock_again --rounds 3 --updates 250 --timeout 150 --deadline $(( $(left) - 60 )) "${SMOKE[@]}"
else
    job --runs stock,fast_eager --rounds 2 --updates 250 --timeout 150 --deadline $(( $(left) - 300 )) "${SMOKE[@]}"
    [ "$(left)" -gt 90 ] && job --runs stock,fast,stock_again --size big --tokens 16384 --rounds 2 --updates 100 --interval 5 --skip 10 \
        --timeout 120 --deadline $(( $(left) - 90 )) "${SMOKE[@]}"
fi
echo "[fast_path_job] part $PART done in $((SECONDS - T0)) s"
ls -la "$OUT"
