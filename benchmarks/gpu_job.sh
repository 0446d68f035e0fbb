#!/usr/bin/env bash
# The GPU session's one device call for issue 35 (docs/benchmarks.md, "GPU training through
# fairseq's trainer"). On a bare machine with Python 3.12 and its own torch, no network:
#
#   run(command="bash benchmarks/gpu_job.sh", carry=[".gpu"], timeout_s=600)
#
# .gpu/ (ignored by git; how to rebuild it: docs/benchmarks.md) holds
#   whl/        ve-fairseq 0.12.3 cp312 and the dependencies the machine lacks
#               (bitarray, hydra-core, omegaconf, antlr4-python3-runtime 4.9.3)
#   multi30k/   the prepared Multi30k EN-DE (resnmt's data prep: sentencepiece 8000, joined dictionary)
#   test-data/  a copy of ../shared/data/multi30k for the tests' tiny corpus (RESNMT_TEST_DATA)
#
# Steps, in order of what they settle, each bounded so the whole job ends inside
# GPU_JOB_SECONDS (default 520 s, under the 600 s call limit):
#   1. the GPU checks: adam_fused against adam on CUDA; two ranks sharing the GPU over gloo
#      (fp32 fairseq-train, bf16 + adam_fused resnmt-train) in lockstep;
#   2. whole fairseq-train processes: stock --arch transformer --fp16, --user-dir resnmt
#      --arch transformer_postln_base --fp16, and the recipe through resnmt-train: fairseq's wps;
#   3. the trainer table at 4096 tokens: every row in bf16, the same-math pair in fp16 too,
#      stock fp16 against the recipe, the profile of one update;
#   4. the table at 16384 tokens: the same-math pair and stock against the recipe.
# Everything lands under $OUT: job.log, gpu_tests.txt, gpu_train.jsonl, profile.json.
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
BUDGET=${GPU_JOB_SECONDS:-520}
T0=$SECONDS
left() { echo $(( BUDGET - (SECONDS - T0) )); }
exec > >(tee -a "$OUT/job.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=4

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl \
    || { echo "gpu_job: installing .gpu/whl failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD" PATH="/tmp/site/bin:$PATH" RESNMT_TEST_DATA="$PWD/.gpu/test-data"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
python3 -c "import torch, fairseq, resnmt; print('torch', torch.__version__, 'fairseq', fairseq.__version__, torch.cuda.get_device_name(0))" \
    || { echo "gpu_job: fairseq or resnmt does not import"; exit 1; }
echo "[gpu_job] set up in $((SECONDS - T0)) s"

# 1. GPU checks (pytest; the CPU suite runs the rest)
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/test_fused_adam.py::test_equals_fairseq_adam_on_cuda \
    tests/test_distributed.py::test_two_ranks_on_one_device_train_in_lockstep -k cuda 2>&1 | tail -n 40 > "$OUT/gpu_tests.txt"
tail -n 3 "$OUT/gpu_tests.txt"
echo "[gpu_job] checks done at $((SECONDS - T0)) s"

BENCH=(python3 benchmarks/gpu_train.py --data .gpu/multi30k/bin --out "$OUT/gpu_train.jsonl")

# 2. whole fairseq-train processes (no trainer table: --tokens "")
"${BENCH[@]}" --tokens "" --no-recipe --whole-process --whole-updates 200 --whole-interval 10 --whole-skip 20 \
    --deadline $(( $(left) - 330 ))
echo "[gpu_job] whole processes done at $((SECONDS - T0)) s"

# 3. the trainer table at 4096 tokens, with the profile
"${BENCH[@]}" --tokens 4096 --dtypes bf16,fp16 --dtype-rows "fp16:transformer,post_ln" --profile "$OUT/profile.json" \
    --warmup 20 --updates 100 --rounds 3 --deadline $(( $(left) - 100 ))
echo "[gpu_job] 4096-token table done at $((SECONDS - T0)) s"

# 4. 16384 tokens: the same-math pair, stock against the recipe (as many rounds as time leaves, at least one)
if [ "$(left)" -gt 60 ]; then
    "${BENCH[@]}" --tokens 16384 --rows transformer,post_ln --dtypes bf16 --warmup 10 --updates 100 --rounds 3 \
        --deadline $(( $(left) - 40 ))
else
    echo "[gpu_job] no time left for 16384 tokens"
fi
echo "[gpu_job] done in $((SECONDS - T0)) s"
ls -la "$OUT"
