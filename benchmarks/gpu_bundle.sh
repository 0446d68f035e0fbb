#!/usr/bin/env bash
# Builds .gpu/, what a GPU lease carries for benchmarks/gpu_job.sh, on the CPU machine, then
# rehearses every part of the job on the CPU with it (GPU_JOB_SMOKE=1). `make gpu-bundle`
# runs it with the project's virtualenv; re-running skips what is already there.
#
#   .gpu/whl/        ve-fairseq 0.12.3 for CPython 3.12 and the dependencies the GPU machine
#                    lacks (bitarray, hydra-core, omegaconf, antlr4-python3-runtime 4.9.3)
#   .gpu/multi30k/   Multi30k EN-DE prepared by resnmt-prepare (from ../shared/data/multi30k)
#   .gpu/test-data/  the tests' tiny corpus (RESNMT_TEST_DATA on the GPU machine)
#
# It fails, naming the cause, when a step fails, when what travels (the working tree's tracked
# and untracked-unignored files plus .gpu/) is over the device tool's 64 MiB, or when a part's
# rehearsal exits non-zero or records an error line. Then, with a GPU lent:
#   timeout 540 bash benchmarks/gpu_job.sh 5   (in the checkout, the .gpu/ bundle beside it; docs/benchmarks.md)
#
#   PYTHON=.venv/bin/python bash benchmarks/gpu_bundle.sh            # build and rehearse
#   GPU_BUNDLE_PARTS="1 2" bash benchmarks/gpu_bundle.sh             # rehearse only these parts
#   GPU_BUNDLE_PARTS= bash benchmarks/gpu_bundle.sh                  # build and check the size only
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
BUNDLE=.gpu
LIMIT_MIB=64
MIRROR=${MULTI30K_MIRROR:-../shared/data/multi30k}
PARTS=${GPU_BUNDLE_PARTS-1 2 3 4 5 5b 11 6 7 8 9 10}  # 5b: part 5's plan B
say() { echo "[gpu-bundle] $*"; }
die() { echo "gpu-bundle: $*" >&2; exit 1; }

[ -d "$MIRROR" ] || die "$MIRROR is missing: set MULTI30K_MIRROR to a folder with Multi30k's train/val/test_2016_flickr .gz files"
mkdir -p "$BUNDLE/whl"

# 1. the wheels (CPython 3.12, manylinux x86-64); antlr4 4.9.3 is published as a source archive only
WHEELS=(ve-fairseq==0.12.3 bitarray==3.12.3 hydra-core==1.3.8 omegaconf==2.3.1)
if [ "$(ls "$BUNDLE"/whl/*.whl 2>/dev/null | wc -l)" -lt 5 ]; then
    say "downloading the cp312 wheels into $BUNDLE/whl"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$BUNDLE/whl" "${WHEELS[@]}" || die "pip download ${WHEELS[*]} failed (the package registry is needed once)"
    "$PY" -m pip wheel -q --no-deps -w "$BUNDLE/whl" antlr4-python3-runtime==4.9.3 \
        || die "building the antlr4-python3-runtime 4.9.3 wheel failed"
fi
say "wheels: $(cd "$BUNDLE/whl" && ls *.whl | tr '\n' ' ')"

# 2. the prepared data (resnmt-prepare skips what it already did)
say "preparing Multi30k EN-DE into $BUNDLE/multi30k"
PATH="$(dirname "$PY"):$PATH" bash data-prep/prepare-multi30k.sh --mirror "$MIRROR" "$BUNDLE/multi30k" >"$BUNDLE/prepare.log" 2>&1 \
    || { tail -n 5 "$BUNDLE/prepare.log" >&2; die "preparing Multi30k failed (its log: $BUNDLE/prepare.log)"; }
[ -f "$BUNDLE/multi30k/bin/dict.en.txt" ] || die "$BUNDLE/multi30k/bin holds no binarized data"
mkdir -p "$BUNDLE/test-data"
rm -rf "$BUNDLE/test-data/multi30k.tmp" && cp -r "$MIRROR" "$BUNDLE/test-data/multi30k.tmp" \
    && rm -rf "$BUNDLE/test-data/multi30k" && mv "$BUNDLE/test-data/multi30k.tmp" "$BUNDLE/test-data/multi30k"

# 3. what travels: the working tree git would send (tracked and untracked-unignored files) and .gpu/
tree_kib=$(git ls-files -z --cached --others --exclude-standard | du -c -k --files0-from=- 2>/dev/null | tail -n 1 | cut -f1)
bundle_kib=$(du -s -k "$BUNDLE" | cut -f1)
total_mib=$(( (tree_kib + bundle_kib + 1023) / 1024 ))
say "travels: working tree $(( tree_kib / 1024 )) MiB + $BUNDLE $(( bundle_kib / 1024 )) MiB = ${total_mib} MiB (limit ${LIMIT_MIB} MiB)"
[ "$total_mib" -le "$LIMIT_MIB" ] || die "what travels is ${total_mib} MiB, over the device tool's ${LIMIT_MIB} MiB: shrink $BUNDLE or the working tree"

# 4. the rehearsal: every part of the job on the CPU, tiny model, with this bundle's data
# (the study's parts 11, 6 and 7 share one GPU_STUDY_WORK, as one warm machine's calls do)
study_work=$(mktemp -d)
for part in $PARTS; do
    out=$(mktemp -d)
    lines="$out/gpu_train.jsonl"
    case "$part" in 6|7) lines="$out/curves.jsonl" ;; 11) lines="$out/sweep.jsonl" ;; 10) lines="$out/fast_path_profile.json" ;; esac
    say "rehearsing part $part (GPU_JOB_SMOKE=1, results in $out)"
    plan_b=0 && [ "$part" = 5b ] && plan_b=1
    OUT="$out" GPU_JOB_SMOKE=1 GPU_JOB_PLAN_B=$plan_b GPU_STUDY_WORK="$study_work" PYTHON="$PY" \
        bash benchmarks/gpu_job.sh "${part%b}" \
        >"$out/rehearsal.log" 2>&1 \
        || { tail -n 20 "$out/rehearsal.log" >&2; die "part $part's rehearsal exited non-zero ($out/rehearsal.log)"; }
    [ -s "$lines" ] || { tail -n 20 "$out/rehearsal.log" >&2; die "part $part's rehearsal recorded no rows ($out/rehearsal.log)"; }
    if grep -q '"error"' "$lines"; then
        grep '"error"' "$lines" | head -n 3 >&2
        die "part $part's rehearsal recorded an error line ($lines)"
    fi
    say "part $part rehearsed: $(grep -c . "$lines") lines"
    rm -rf "$out"
done
rm -rf "$study_work"
say "ready: on the GPU machine, with .gpu/ beside the checkout: timeout 540 bash benchmarks/gpu_job.sh 5 first (gpu_job.sh's header: the lease plan)"
