# The curves study at the papers' sizes: parts 11, 6 and 7 of benchmarks/gpu_job.sh,
# which sources this file after its set-up ($PY, $OUT, $BUDGET, left, GPU_JOB_SMOKE). Every
# run trains in bf16 (resnmt-train's --bf16), each run side by side on its own CPU cores (--pin-cores),
# under NVIDIA MPS where `nvidia-cuda-mps-control -d` starts it (stopped at the part's end; one line
# says whether it runs), and trains, averages, decodes and scores on the machine
# (benchmarks/curves.py); its checkpoints and the lines of this lease's earlier
# parts stay in $GPU_STUDY_WORK (default /tmp/resnmt-study) while the machine stays warm, so a part
# stopped at its budget resumes in the next call; a fresh machine restarts unfinished runs at update 0
# (their recorded milestones are not scored again: benchmarks/results/curves.jsonl counts as done).
#
# Part 11, the concurrency sweep (the first call of the first study lease): post-LN at base size in
#   bf16, 1, 4, 8 and 12 runs side by side (GPU_SWEEP_COUNTS), each step a window of GPU_SWEEP_SECONDS
#   (default 60, start-up included); each run's updates per second from fairseq's train_inner lines,
#   their total per N -> sweep.jsonl (the lead appends it to benchmarks/results/concurrency_sweep.jsonl)
#   and throughput.txt, whose last line is the runs side by side that parts 6 and 7 then train
#   (campaign.plan.workers_from_sweep: the highest total that lets each run end within a lease).
# Part 6, the schedule sweep (at once after part 11): post-LN at base size, seed 1,
#   under each of campaign.plan.SWEEP_SCHEDULES side by side to 2000 updates (milestones 1000, 2000;
#   checkpoints kept, so part 7 continues the chosen one); then campaign.plan.choose_schedule's choice
#   (schedule.txt: the rule's reading of every candidate) and the updates per second the three
#   runs shared (throughput.txt), with the worker count of the concurrency sweep where it ran
#   (this machine's, else the committed lines), else campaign.plan.workers_for's from that rate.
# Part 7, the study: the papers'-size rows of campaign.plan.PAPERS_SIZE_ORDER in order under the chosen
#   schedule (GPU_STUDY_LR/GPU_STUDY_WARMUP override it), GPU_STUDY_WORKERS side by side
#   (default: the number parts 11/6 measured on this machine, else the committed sweep's, else 2), to 4000 updates.
# All train with --sdpa-backends flash,efficient,math and a checkpoint every 100 updates
# (5 averaged); GPU_STUDY_FAST_PATH=1 adds --fast-path to part 7 (not yet run on a GPU: opt in
# only after its own part has passed; its runs have a settings key of their own), GPU_STUDY_ONLY=SIZE:ROW:SEED,... restricts the runs. What
# comes back under $OUT (at most 5 files; the device tool returns at most 8): job.log, curves.jsonl (the
# lead appends it to benchmarks/results/curves.jsonl), logs.tar.gz (every run's log and the
# sweeps' output), schedule.txt, and throughput.txt (parts 6 and 11), sweep.jsonl (part 11) or
# study-list.txt (part 7: done, partial, missing).
STUDY_WORK=${GPU_STUDY_WORK:-/tmp/resnmt-study}
mkdir -p "$STUDY_WORK/logs" && touch "$STUDY_WORK/lines.jsonl"
if [ "${GPU_JOB_SMOKE:-0}" = 1 ]; then
    # the rehearsal: tiny models on the CPU, two milestones, two runs of the study
    STUDY=(--device cpu --tiny --max-tokens 1024 --save-every 1 --average 2 --analyze-sentences 8)
    : "${GPU_STUDY_WORKERS:=2}"  # two runs side by side, as on the GPU
    SWEEP_MILESTONES=2 STUDY_MILESTONES=(--milestones 2,4) STUDY_ONLY=${GPU_STUDY_ONLY:-base:pre_ln:1,base12:post_ln:1}
    : "${GPU_SWEEP_COUNTS:=1,2}" "${GPU_SWEEP_SECONDS:=20}"  # the concurrency sweep's steps, short
else
    pkill -f "benchmarks/curves.py|bin/fairseq-train|resnmt.cli.train|resnmt-analyze|fairseq-generate" && sleep 2
    STUDY=(--device cuda --save-every 100 --average 5)
    SWEEP_MILESTONES=1000,2000 STUDY_MILESTONES=() STUDY_ONLY=${GPU_STUDY_ONLY:-}
fi
# bf16 (as the papers' half precision; a settings key of its own), each run on its own CPU cores
STUDY+=(--bf16 --pin-cores --sdpa-backends flash,efficient,math --data .gpu/multi30k --threads 1
        --workdir "$STUDY_WORK/runs" --out "$OUT/curves.jsonl"
        --done-from benchmarks/results/curves.jsonl --done-from "$STUDY_WORK/lines.jsonl")
# the concurrency sweep's lines: this machine's (part 11), then the committed ones
SWEEPS=(--sweep-lines "$STUDY_WORK/sweep.jsonl" --sweep-lines benchmarks/results/concurrency_sweep.jsonl)
# NVIDIA MPS (kernels of several processes on the GPU at once) where its daemon starts; not in a rehearsal
MPS=0
mps_up() { "$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); from campaign.concurrency import mps_running; exit(0 if mps_running() else 1)"; }
mps_stop() { if [ "$MPS" = 1 ]; then echo quit | nvidia-cuda-mps-control; MPS=0; echo "[gpu_job] MPS: stopped"; fi; }
if [ "${GPU_JOB_SMOKE:-0}" = 1 ]; then
    echo "[gpu_job] MPS: not in a rehearsal (CPU)"
elif ! command -v nvidia-cuda-mps-control > /dev/null; then
    echo "[gpu_job] MPS: no nvidia-cuda-mps-control on this machine; the runs share the GPU without it"
elif mps_up; then
    MPS=1; echo "[gpu_job] MPS: already running (left by an earlier part); used, and stopped at this part's end"
elif nvidia-cuda-mps-control -d; then
    MPS=1; echo "[gpu_job] MPS: started (nvidia-cuda-mps-control -d)"
else
    echo "[gpu_job] MPS: nvidia-cuda-mps-control -d failed (exit $?); the runs share the GPU without it"
fi
# a daemon whose server cannot open the GPU would fail every run: one CUDA tensor first, else without MPS
if [ "$MPS" = 1 ] && ! err=$(timeout 90 "$PY" -c "import torch; torch.ones(1, device='cuda').sum().item()" 2>&1); then
    mps_stop; echo "[gpu_job] MPS: CUDA failed under it (${err##*$'\n'}); the runs share the GPU without it"
fi
trap mps_stop EXIT  # at the part's end, whichever way it ends
trap 'exit 143' TERM INT
[ "$PART" = 7 ] && [ "${GPU_STUDY_FAST_PATH:-0}" = 1 ] && STUDY+=(--fast-path)  # the sweep: stock path only
curves() { "$PY" benchmarks/curves.py "${STUDY[@]}" "$@"; }
study_done() {  # what this part leaves: its lines for the next part, the logs, the plan's state
    [ -s "$OUT/curves.jsonl" ] && cat "$OUT/curves.jsonl" >> "$STUDY_WORK/lines.jsonl"
    for log in "$STUDY_WORK"/runs/*/*/*/log.txt; do
        [ -f "$log" ] && cp "$log" "$STUDY_WORK/logs/$(echo "${log#"$STUDY_WORK"/runs/}" | tr '/' '-')"
    done
    tar -czf "$OUT/logs.tar.gz" -C "$STUDY_WORK" logs  # one file: the device tool returns at most 8
    echo "[gpu_job] $(grep -c . "$OUT/curves.jsonl" 2>/dev/null || echo 0) milestone lines in this part"
}
STUDY_RC=0
if [ "$PART" = 11 ]; then
    counts=${GPU_SWEEP_COUNTS:-1,4,8,12}
    # each step's window: GPU_SWEEP_SECONDS (default 60), shortened so that every step ends within the budget
    # (each step also waits up to 10 s for its runs to stop)
    steps=$(echo "$counts" | tr ',' '\n' | grep -c .)
    window=$(( ($(left) - 45) / steps - 10 ))
    [ "$window" -gt "${GPU_SWEEP_SECONDS:-60}" ] && window=${GPU_SWEEP_SECONDS:-60}
    echo "[gpu_job] concurrency sweep: post-LN base, bf16, $counts runs side by side, $window s each"
    timeout -k 10 $(( $(left) - 20 )) "$PY" benchmarks/curves.py "${STUDY[@]}" --sizes base,base12 "${STUDY_MILESTONES[@]}" \
        --concurrency-sweep "$counts" --sweep-seconds "$window" --sweep-lines "$OUT/sweep.jsonl" \
        | tee "$OUT/throughput.txt" || STUDY_RC=$?
    [ -s "$OUT/sweep.jsonl" ] && cat "$OUT/sweep.jsonl" >> "$STUDY_WORK/sweep.jsonl"
    grep -qx '[0-9][0-9]*' <(tail -n 1 "$OUT/throughput.txt") && tail -n 1 "$OUT/throughput.txt" > "$STUDY_WORK/workers.txt"
    mkdir -p "$STUDY_WORK/logs/concurrency-sweep"
    cp -r "$STUDY_WORK"/runs/concurrency-sweep/. "$STUDY_WORK/logs/concurrency-sweep/" 2>/dev/null
    tar -czf "$OUT/logs.tar.gz" -C "$STUDY_WORK" logs
    echo "[gpu_job] concurrency sweep done at $((SECONDS - T0)) s (exit $STUDY_RC); runs side by side: $(cat "$STUDY_WORK/workers.txt" 2>/dev/null || echo unmeasured)"
elif [ "$PART" = 6 ]; then
    mapfile -t CANDIDATES < <("$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); from campaign.plan import SWEEP_SCHEDULES
for lr, warmup in SWEEP_SCHEDULES: print(f'{lr:g} {warmup}')")
    [ "${#CANDIDATES[@]}" -gt 0 ] || { echo "gpu_job: campaign.plan.SWEEP_SCHEDULES could not be read"; exit 1; }
    # each candidate on its own cores (campaign.cores.core_sets), as --pin-cores pins --workers' copies
    mapfile -t CORES < <("$PY" -c "import sys; sys.path.insert(0, 'benchmarks'); from campaign.cores import core_sets
for cores in core_sets(${#CANDIDATES[@]}): print(','.join(map(str, cores)))")
    pids=() i=0
    for candidate in "${CANDIDATES[@]}"; do
        read -r lr warmup <<< "$candidate"
        echo "[gpu_job] sweep: post-LN base, lr $lr, warm-up $warmup, to $SWEEP_MILESTONES updates, on cores ${CORES[$i]}"
        taskset -c "${CORES[$i]}" timeout -k 10 $(( $(left) - 40 )) "$PY" benchmarks/curves.py "${STUDY[@]}" --sizes base --only base:post_ln:1 \
            --lr "$lr" --warmup "$warmup" --milestones "$SWEEP_MILESTONES" --keep-checkpoints \
            > "$STUDY_WORK/logs/sweep-lr$lr-warmup$warmup.log" 2>&1 &
        pids+=($!) i=$((i + 1))
    done
    for pid in "${pids[@]}"; do wait "$pid" || STUDY_RC=$?; done
    [ "$STUDY_RC" = 124 ] && STUDY_RC=0  # stopped at the budget: choose_schedule judges the newest shared milestone
    echo "[gpu_job] sweep done at $((SECONDS - T0)) s (exit $STUDY_RC)"
    study_done
    curves --sizes base,base12 "${STUDY_MILESTONES[@]}" --throughput "${SWEEPS[@]}" | tee "$OUT/throughput.txt"
    tail -n 1 "$OUT/throughput.txt" > "$STUDY_WORK/workers.txt"
    curves --sizes base --choose-schedule > "$STUDY_WORK/schedule.txt" 2> "$OUT/schedule.txt" \
        || { cat "$OUT/schedule.txt"; echo "gpu_job: choosing the schedule failed"; exit 1; }
    cat "$OUT/schedule.txt"; echo "[gpu_job] the study's schedule (lr warm-up): $(cat "$STUDY_WORK/schedule.txt")"
else
    if [ -n "${GPU_STUDY_LR:-}" ]; then
        SCHEDULE="${GPU_STUDY_LR} ${GPU_STUDY_WARMUP:?GPU_STUDY_LR needs GPU_STUDY_WARMUP}"
    else
        SCHEDULE=$(curves --sizes base --choose-schedule 2> "$OUT/schedule.txt") \
            || { cat "$OUT/schedule.txt"; echo "gpu_job: choosing the schedule failed"; exit 1; }
        cat "$OUT/schedule.txt"
    fi
    read -r lr warmup <<< "$SCHEDULE"
    if [ -z "${GPU_STUDY_WORKERS:-}" ] && [ ! -s "$STUDY_WORK/workers.txt" ] && [ -s benchmarks/results/concurrency_sweep.jsonl ]; then
        curves --sizes base,base12 "${STUDY_MILESTONES[@]}" --throughput "${SWEEPS[@]}" | tail -n 2 | tee "$OUT/throughput.txt"
        grep -q "concurrency sweep" "$OUT/throughput.txt" && tail -n 1 "$OUT/throughput.txt" > "$STUDY_WORK/workers.txt"
    fi
    workers=${GPU_STUDY_WORKERS:-$(cat "$STUDY_WORK/workers.txt" 2>/dev/null || echo 2)}
    ONLY=(); [ -n "$STUDY_ONLY" ] && ONLY=(--only "$STUDY_ONLY")
    echo "[gpu_job] study: lr $lr, warm-up $warmup, $workers runs side by side${STUDY_ONLY:+, only $STUDY_ONLY}"
    timeout -k 10 $(( $(left) - 25 )) "$PY" benchmarks/curves.py "${STUDY[@]}" --sizes base,base12 "${STUDY_MILESTONES[@]}" \
        --lr "$lr" --warmup "$warmup" --workers "$workers" "${ONLY[@]}" || STUDY_RC=$?
    echo "[gpu_job] study stopped at $((SECONDS - T0)) s (exit $STUDY_RC; 124: the part's budget, resumed by the next call)"
    study_done
    curves --sizes base,base12 "${STUDY_MILESTONES[@]}" --lr "$lr" --warmup "$warmup" "${ONLY[@]}" --list \
        | tee "$OUT/study-list.txt"
    [ "$STUDY_RC" = 124 ] && STUDY_RC=0  # stopped at the budget: expected
fi
