#!/usr/bin/env bash
# The GPU session's device calls for the fast path and the curves study (docs/benchmarks.md, "GPU training through
# fairseq's trainer"; docs/study.md). On a bare machine with Python 3.12 and its own torch, no
# network. A 15-minute lease holds a start (2-3 min) and about 12 minutes of parts. The plan:
#
#   (each command run in the checkout with the .gpu/ bundle beside it and OUT naming the results folder)
#   the next lease: the fast path (it decides how many leases the study needs), then its
#   larger settings, each a part of its own
#   timeout 540 bash benchmarks/gpu_job.sh 5
#   timeout 540 bash benchmarks/gpu_job.sh 8
#   timeout 540 bash benchmarks/gpu_job.sh 9
#   timeout 150 bash benchmarks/gpu_job.sh 10  # the fast path's own profile, where a lease has the time
#   the lease after: the study's concurrency sweep, its schedule sweep and post-LN continued
#   (parts 11, 6 and 7, below)
#   later leases: part 7 (with GPU_STUDY_FAST_PATH=1 where part 5 passed), or parts 1-4 again
#   where a lever of part 5's profile needs them:
#   timeout 340 bash benchmarks/gpu_job.sh 2
#   GPU_JOB_SECONDS=380 timeout 420 bash benchmarks/gpu_job.sh 3
#   timeout 540 bash benchmarks/gpu_job.sh 1
#   timeout 300 bash benchmarks/gpu_job.sh 4
# The curves study at the papers' sizes (parts 11, 6 and 7, in benchmarks/gpu_study.sh):
#   timeout 330 bash benchmarks/gpu_job.sh 11  # its first lease: the concurrency sweep (1, 4, 8, 12 runs at once)
#   GPU_JOB_SECONDS=370 timeout 410 bash benchmarks/gpu_job.sh 6  # at once after: the schedule sweep
#   GPU_JOB_SECONDS=150 GPU_STUDY_WORKERS=1 GPU_STUDY_ONLY=base:post_ln:1 timeout 200 bash benchmarks/gpu_job.sh 7  # where time is left: post-LN on
#   timeout 570 bash benchmarks/gpu_job.sh 7   # every later lease: the study
#   GPU_JOB_SECONDS=150 timeout 200 bash benchmarks/gpu_job.sh 7  # at once after
# Estimate (to be recomputed from part 11's sweep.jsonl): every study run trains in bf16
# (resnmt-train --bf16, as the papers trained in half precision), each run side by side on its own
# CPU cores (--pin-cores; the machine has 16), under NVIDIA MPS where `nvidia-cuda-mps-control -d`
# starts it, and parts 6 and 7 train as many runs at once as the sweep's highest total updates per
# second allows with each run ending within its lease (campaign.plan.workers_from_sweep). What was
# measured before, in fp32 without pinning or MPS: base-size runs side by side on the H100 shared
# about 20 updates/s (3.3-3.9 each with five to six at once, checkpoints every 40 updates; the GPU
# lines of curves.jsonl), and one process alone is bound by the host at about 13 updates/s (H200,
# fp16, 46.5k target tokens/s at 3439 per update; docs/benchmarks.md). A run cannot outlive its
# lease: about 620 s are left for training and scoring after the start (~150 s) and two set-ups, and
# its 4 milestones cost about 55 s each beside training, so W runs of 4000 updates fit where
# 4000 / (T_W / W) + 220 <= 620 s, T_W the sweep's total with W at once: at fp32's 20 updates/s,
# W = 2 base runs per lease, and the 14 runs (9 base, 5 at 12+12) take about 10 leases after the
# sweep's. The target, every base row in 2 leases and every 12+12 row in 2 more, needs W >= 5 base
# runs at once, a total T_5 >= 50 updates/s (a 12+12 run costs about twice a base run per update:
# 3 at once need about 60 in base updates). The sweep's lease gives the sweep and post-LN under three schedules to
# 2000 updates. Part 11 leaves the count on the machine for parts 6 and 7; later leases read it from
# the committed benchmarks/results/concurrency_sweep.jsonl (or take GPU_STUDY_WORKERS). The fast
# path (GPU_STUDY_FAST_PATH=1, once its own part has passed on a GPU) is what can shorten this further.
#
# .gpu/ (ignored by git; `make gpu-bundle` builds it and rehearses every part on the CPU) holds
#   whl/        ve-fairseq 0.12.3 cp312 and the dependencies the machine lacks
#               (bitarray, hydra-core, omegaconf, antlr4-python3-runtime 4.9.3)
#   multi30k/   the prepared Multi30k EN-DE (resnmt's data prep: sentencepiece 8000, joined dictionary)
#   test-data/  a copy of ../shared/data/multi30k for the tests' tiny corpus (RESNMT_TEST_DATA)
#
# Part 1 (GPU_JOB_SECONDS, default 450 s):
#   the GPU checks: adam_fused against adam on CUDA; two ranks sharing the GPU over gloo
#   (fp32 fairseq-train, bf16 + adam_fused resnmt-train) in lockstep;
#   the trainer table at 4096 tokens in bf16: every row, stock fp16, the recipe and the recipe
#   with --fused-master-weights (and transformer in bf16 twice: the noise floor),
#   8 interleaved rounds of up to 30 updates (as many as the budget holds), and the
#   profile of one update.
# Part 2 (default 300 s): the attention kernels on CUDA (cuDNN's against FlashAttention's);
#   whole fairseq-train processes of 320 updates (the first epoch, about 130 updates, meets
#   every batch shape first): stock --arch transformer --fp16, the recipe with
#   --sdpa-backends flash,efficient,math, stock again (the two stock processes' difference
#   is the noise floor of the ratios), the recipe, --user-dir resnmt --arch
#   transformer_postln_base --fp16 (fairseq's own wps, per epoch; what the deadline leaves
#   out is not started).
# Part 3 (default 420 s): --compile-layers' inductor kernels and its CUDA graphs
#   (--compile-mode reduce-overhead) against eager on CUDA; the same-math pair in fp16 at
#   4096 tokens with stock fp16, the compiled recipe and the compiled recipe with CUDA graphs
#   (their compilation takes minutes, so they are measured here); the pair, stock and the
#   recipe at 16384.
# Part 4 (default 240 s): the methods that cross layers, Peri-LN, RMSNorm/DyT and the 2025
#   kinds against their references, at 4096 tokens in bf16 (gpu_train.CROSS_LAYER_ROWS).
# Part 5 (default 500 s), the fast path (--fast-path, resnmt/training/fast/), the most
#   decisive numbers first: the CUDA checks of tests/test_fast_path.py (the captured update equals
#   the eager one; a step that cannot be captured runs eagerly; the fast path's losses equal
#   fairseq's step; no host sync in an update; the update's Triton Adam kernel against fairseq's Adam, the fused
#   cross-entropy kernel against fairseq's label-smoothed loss;
#   then, in a process of its own, captured training against eager) -> fast_path_tests*.txt; whole
#   processes at base size, 4096 tokens, 200 updates
#   (Multi30k's first epoch is about 135), 3 rounds ordered stock, fast, fast, stock (A B B A: the
#   stock pair is the noise floor; the verdict needs the lowest round's ratio over the floor to
#   clear 3x). Plan B in the same part: where the captured training check failed, the rounds
#   measure the fast path without its CUDA graphs (--no-step-capture) and with torch.compile's
#   reduce-overhead graphs per layer instead, so a failed capture still yields ratios.
#   Then, where 75 s are left, the fast path's own profile (as part 10's, at most 60 s).
# Part 10 (default 120 s): the fast path's own profile alone (benchmarks/fast_profile.py: base size,
#   4096 tokens, bf16, 10 updates after 10: wall, host and kernel time per update, kernel and graph
#   launches, syncs, top kernels) -> fast_path_profile.json, after the Triton kernels' checks (Adam, the loss);
#   timeout 150 bash benchmarks/gpu_job.sh 10 (where a lease has the time after part 5).
# Part 8 (default 500 s): transformer-big at 16384 tokens, stock against the fast path (A B B A
#   rounds; MFU against the measured bf16 peak).
# Part 9 (default 500 s): base at 32768 tokens, stock against the fast path (A B B A rounds).
# Parts 11, 6 and 7 (defaults 300, 530 and 530 s): the curves study, described above and in
#   benchmarks/gpu_study.sh (sweep.jsonl, throughput.txt, curves.jsonl, schedule.txt,
#   study-list.txt, logs.tar.gz).
# Each step stops starting new work at its deadline; whatever finished is under $OUT:
# job.log, gpu_tests*.txt and fast_path_tests*.txt (the CUDA checks of parts 1-3 and 5),
# gpu_train.jsonl (a line per finished whole process, as it ends), profile.json (part 1),
# fast_path_profile.json (parts 5 and 10).
# GPU_JOB_SMOKE=1 rehearses the steps on the CPU (tiny model, few updates) where fairseq
# is already installed (part 5: plan A; GPU_JOB_PLAN_B=1 takes plan B, on the GPU too);
# PYTHON names the interpreter (default python3).
set -uo pipefail
: "${OUT:?set OUT to the folder the results go to}"
PART=${1:-1}
case "$PART" in
    1) BUDGET=${GPU_JOB_SECONDS:-450} ;;
    3) BUDGET=${GPU_JOB_SECONDS:-420} ;;
    2) BUDGET=${GPU_JOB_SECONDS:-300} ;;
    4) BUDGET=${GPU_JOB_SECONDS:-240} ;;
    5|8|9) BUDGET=${GPU_JOB_SECONDS:-500} ;;
    10) BUDGET=${GPU_JOB_SECONDS:-120} ;;
    6|7) BUDGET=${GPU_JOB_SECONDS:-530} ;;
    11) BUDGET=${GPU_JOB_SECONDS:-300} ;;
    *) echo "gpu_job.sh: part '$PART': give 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 or 11"; exit 2 ;;
esac
T0=$SECONDS
left() { echo $(( BUDGET - (SECONDS - T0) )); }
exec > >(tee -a "$OUT/job.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

PY=${PYTHON:-python3}
SMOKE=()
[ "${GPU_JOB_SMOKE:-0}" = 1 ] && SMOKE=(--smoke --cpu --warmup 1 --updates 2 --batches 4 --whole-updates 4 --whole-interval 1
                                       --whole-skip 1 --compile-backend eager)
if ! "$PY" -c "import fairseq" 2>/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl \
        || { echo "gpu_job: installing .gpu/whl failed"; exit 1; }
fi
export PYTHONPATH="/tmp/site:$PWD" PATH="/tmp/site/bin:$PATH" RESNMT_TEST_DATA="$PWD/.gpu/test-data"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
"$PY" -c "import torch, fairseq, resnmt; print('torch', torch.__version__, 'fairseq', fairseq.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA')" \
    || { echo "gpu_job: fairseq or resnmt does not import"; exit 1; }
# a part stopped from outside (the device tool's limit) can leave its python processes running on a
# warm machine: stop them, and show what else holds the GPU, so that no timing shares it unseen
# (not in a rehearsal: on the CPU machine those names may be someone else's)
[ "${GPU_JOB_SMOKE:-0}" = 1 ] || { pkill -f "benchmarks/gpu_train.py|benchmarks/fast_profile.py|fairseq_cli.train|resnmt.cli.train|tests/test_" && sleep 2; }
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv 2>/dev/null || true
echo "[gpu_job] part $PART set up in $((SECONDS - T0)) s"
# every step ends by the part's budget, killed if need be (rows are written as rounds finish)
if [ "$PART" = 6 ] || [ "$PART" = 7 ] || [ "$PART" = 11 ]; then  # the curves study
    . benchmarks/gpu_study.sh
    echo "[gpu_job] part $PART done in $((SECONDS - T0)) s"
    exit "$STUDY_RC"
fi
bench() { timeout -k 5 "$(left)" "$PY" benchmarks/gpu_train.py --data .gpu/multi30k/bin --out "$OUT/gpu_train.jsonl" "$@"; }
# abba STOCK FAST[,FAST2] FLAGS...: 3 rounds of whole processes, each round stock, the fast runs, the
# fast runs again, stock (A B B A: a drift over the round weighs on both; stock twice is the noise floor)
abba() {
    local stock=$1 fast=$2
    shift 2
    bench --tokens "" --no-recipe --whole-process --whole-rounds 3 --whole-runs "$stock,$fast,$fast,$stock" "$@"
}
# fast_profile SECONDS: the fast path's own profile (benchmarks/fast_profile.py) -> fast_path_profile.json
fast_profile() {
    local args=(--warmup 10 --updates 10)
    [ "${GPU_JOB_SMOKE:-0}" = 1 ] && args=(--smoke --cpu --warmup 2 --updates 2)
    timeout -k 5 "$1" "$PY" benchmarks/fast_profile.py --data .gpu/multi30k/bin --out "$OUT/fast_path_profile.json" \
        "${args[@]}" > "$OUT/fast_path_profile.log" 2>&1
    tail -n 1 "$OUT/fast_path_profile.log"
    echo "[gpu_job] the fast path's profile done at $((SECONDS - T0)) s"
}

if [ "$PART" = 1 ]; then
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
        tests/test_fused_adam.py::test_equals_fairseq_adam_on_cuda \
        tests/test_distributed.py::test_two_ranks_on_one_device_train_in_lockstep -k cuda 2>&1 | tail -n 40 > "$OUT/gpu_tests.txt"
    tail -n 3 "$OUT/gpu_tests.txt"
    echo "[gpu_job] checks done at $((SECONDS - T0)) s"
    bench --tokens 4096 --dtypes bf16 --recipes recipe,recipe_fused --profile "$OUT/profile.json" --warmup 10 \
        --updates 30 --rounds 8 --deadline $(( $(left) - 30 )) "${SMOKE[@]}"
    echo "[gpu_job] 4096-token bf16 table done at $((SECONDS - T0)) s"
elif [ "$PART" = 4 ]; then
    bench --tokens 4096 --dtypes bf16 --no-recipe --warmup 10 --updates 30 --rounds 8 \
        --rows transformer,transformer_prenorm,post_ln,pre_ln,peri_ln,b2t,resi_dual,dlcl,dlcl_post,pre_ln_rms_norm,post_ln_rms_norm,pre_ln_dyt,post_ln_dyt,hyper,mhc,mix_ln,ln_scaling,hybrid_norm,denseformer \
        --deadline $(( $(left) - 40 )) "${SMOKE[@]}"
elif [ "$PART" = 5 ]; then
    timeout 120 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fast_path.py \
        tests/test_fused_adam_kernel.py tests/test_fused_loss_kernel.py -k "on_cuda and not captured_training or kernel" \
        2>&1 | tail -n 40 \
        > "$OUT/fast_path_tests.txt"
    tail -n 3 "$OUT/fast_path_tests.txt"
    timeout 60 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
        tests/test_fast_path.py::test_on_cuda_captured_training_equals_eager_training 2>&1 | tail -n 60 \
        > "$OUT/fast_path_tests2.txt"
    tail -n 2 "$OUT/fast_path_tests2.txt"
    echo "[gpu_job] checks done at $((SECONDS - T0)) s"
    FAST=resnmt_train_fast_bf16
    CAPTURED="1 passed"  # (the rehearsal has no CUDA: its skipped check rehearses plan A; GPU_JOB_PLAN_B=1, plan B)
    [ "${GPU_JOB_SMOKE:-0}" = 1 ] && CAPTURED="1 (passed|skipped)"
    if [ "${GPU_JOB_PLAN_B:-0}" = 1 ] || ! grep -qE "$CAPTURED" "$OUT/fast_path_tests2.txt"; then  # plan B
        why="the captured step failed its check"
        [ "${GPU_JOB_PLAN_B:-0}" = 1 ] && why="GPU_JOB_PLAN_B=1"
        echo "[gpu_job] $why: plan B (--no-step-capture, torch.compile reduce-overhead)"
        FAST=resnmt_train_fast_eager_bf16,resnmt_train_fast_compiled_graphs_bf16
    fi
    abba stock_fairseq_train_fp16 "$FAST" --whole-updates 200 --whole-interval 10 --whole-skip 20 \
        --whole-timeout 90 --deadline $(( $(left) - 30 )) "${SMOKE[@]}"
    echo "[gpu_job] base: the fast path against stock done at $((SECONDS - T0)) s"
    if [ "$(left)" -gt 75 ]; then fast_profile 60; fi  # the rounds first: the profile where time is left
elif [ "$PART" = 10 ]; then
    timeout 60 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" tests/test_fused_adam_kernel.py \
        tests/test_fused_loss_kernel.py 2>&1 \
        | tail -n 20 > "$OUT/fast_path_tests.txt"
    tail -n 1 "$OUT/fast_path_tests.txt"
    fast_profile $(( $(left) - 10 ))
elif [ "$PART" = 8 ]; then
    BIG_TOKENS=16384
    [ "${GPU_JOB_SMOKE:-0}" = 1 ] && BIG_TOKENS=1024  # (the rehearsal's CPU: a tiny model, few tokens)
    abba stock_fairseq_train_big_fp16 resnmt_train_fast_big_bf16 --whole-tokens $BIG_TOKENS --whole-updates 80 \
        --whole-interval 5 --whole-skip 10 --whole-timeout 100 --deadline $(( $(left) - 30 )) "${SMOKE[@]}"
    echo "[gpu_job] transformer-big done at $((SECONDS - T0)) s"
elif [ "$PART" = 9 ]; then
    TOKENS=32768
    [ "${GPU_JOB_SMOKE:-0}" = 1 ] && TOKENS=2048
    abba stock_fairseq_train_fp16 resnmt_train_fast_bf16 --whole-tokens $TOKENS --whole-updates 80 \
        --whole-interval 5 --whole-skip 10 --whole-timeout 100 --deadline $(( $(left) - 30 )) "${SMOKE[@]}"
    echo "[gpu_job] base at $TOKENS tokens done at $((SECONDS - T0)) s"
elif [ "$PART" = 2 ]; then
    timeout 60 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
        tests/test_sdpa_backends.py::test_on_cuda_kernels_compute_the_same_in_bf16 2>&1 | tail -n 20 > "$OUT/gpu_tests2.txt"
    tail -n 1 "$OUT/gpu_tests2.txt"
    bench --tokens "" --no-recipe --whole-process --whole-updates 320 --whole-interval 10 --whole-skip 20 \
        --whole-runs stock_fairseq_train_fp16,resnmt_train_recipe_flash_bf16,stock_fairseq_train_fp16,resnmt_train_recipe_bf16,resnmt_postln_fp16 \
        --whole-timeout 80 --deadline $(( $(left) - 70 )) "${SMOKE[@]}"
    echo "[gpu_job] whole processes done at $((SECONDS - T0)) s"
else
    timeout 150 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
        tests/test_compile.py::test_on_cuda_trains_like_eager 2>&1 | tail -n 40 > "$OUT/gpu_tests3.txt"
    tail -n 3 "$OUT/gpu_tests3.txt"
    if [ "$(left)" -gt 60 ]; then
        bench --tokens 4096 --rows transformer,post_ln --dtypes fp16 --recipes recipe_compiled,recipe_graphs --warmup 10 --updates 30 \
            --rounds 8 --deadline $(( $(left) - 100 )) "${SMOKE[@]}"
    fi
    if [ "$(left)" -gt 60 ]; then
        bench --tokens 16384 --rows transformer,post_ln --dtypes bf16 --recipes recipe --warmup 10 --updates 30 \
            --rounds 8 --deadline $(( $(left) - 40 )) "${SMOKE[@]}"
    fi
fi
echo "[gpu_job] part $PART done in $((SECONDS - T0)) s"
ls -la "$OUT"
