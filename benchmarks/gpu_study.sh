# The curves study at the papers' sizes: parts 6 and 7 of benchmarks/gpu_job.sh,
# which sources this file after its set-up ($PY, $OUT, $BUDGET, left, GPU_JOB_SMOKE). Every
# run trains, averages, decodes and scores on the machine (benchmarks/curves.py: resnmt-study curves); its
# checkpoints and the lines of this lease's earlier parts stay in $GPU_STUDY_WORK (default
# /tmp/resnmt-study) while the machine stays warm, so a part stopped at its budget resumes in
# the next call; a fresh machine restarts unfinished runs at update 0 (their recorded
# milestones are not scored again: benchmarks/results/curves.jsonl counts as done).
#
# Part 6, the schedule sweep (the first call of the first lease): post-LN at base size, seed 1,
#   under each of resnmt.study.plan.SWEEP_SCHEDULES side by side to 2000 updates (milestones 1000, 2000;
#   checkpoints kept, so part 7 continues the chosen one); then resnmt.study.plan.choose_schedule's choice
#   (schedule.txt: the rule's reading of every candidate) and the updates per second the three
#   runs shared, with the worker count resnmt.study.plan.workers_for derives from it (throughput.txt).
# Part 7, the study: the papers'-size rows of resnmt.study.plan.PAPERS_SIZE_ORDER in order under the chosen
#   schedule (GPU_STUDY_LR/GPU_STUDY_WARMUP override it), GPU_STUDY_WORKERS side by side
#   (default: part 6's measured number on this machine, else 2), to 4000 updates.
# Both train with --sdpa-backends flash,efficient,math and a checkpoint every 100 updates
# (5 averaged); GPU_STUDY_FAST_PATH=1 adds --fast-path to part 7 (not yet run on a GPU: opt in
# only after its own part has passed; its runs have a settings key of their own), GPU_STUDY_ONLY=SIZE:ROW:SEED,... restricts the runs. What
# comes back under $OUT (5 files; the device tool returns at most 8): job.log, curves.jsonl (the
# lead appends it to benchmarks/results/curves.jsonl), logs.tar.gz (every run's log and the
# sweep's output), schedule.txt, and throughput.txt (part 6) or study-list.txt (part 7: done,
# partial, missing).
STUDY_WORK=${GPU_STUDY_WORK:-/tmp/resnmt-study}
mkdir -p "$STUDY_WORK/logs" && touch "$STUDY_WORK/lines.jsonl"
if [ "${GPU_JOB_SMOKE:-0}" = 1 ]; then
    # the rehearsal: tiny models on the CPU, two milestones, two runs of the study
    STUDY=(--device cpu --tiny --max-tokens 1024 --save-every 1 --average 2 --analyze-sentences 8)
    : "${GPU_STUDY_WORKERS:=2}"  # two runs side by side, as on the GPU
    SWEEP_MILESTONES=2 STUDY_MILESTONES=(--milestones 2,4) STUDY_ONLY=${GPU_STUDY_ONLY:-base:pre_ln:1,base12:post_ln:1}
else
    pkill -f "benchmarks/curves.py|resnmt.cli.study|bin/fairseq-train|resnmt-analyze|fairseq-generate" && sleep 2
    STUDY=(--device cuda --save-every 100 --average 5)
    SWEEP_MILESTONES=1000,2000 STUDY_MILESTONES=() STUDY_ONLY=${GPU_STUDY_ONLY:-}
fi
STUDY+=(--sdpa-backends flash,efficient,math --data .gpu/multi30k --threads 1 --workdir "$STUDY_WORK/runs" --out "$OUT/curves.jsonl"
        --done-from benchmarks/results/curves.jsonl --done-from "$STUDY_WORK/lines.jsonl")
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
if [ "$PART" = 6 ]; then
    mapfile -t CANDIDATES < <("$PY" -c "from resnmt.study.plan import SWEEP_SCHEDULES
for lr, warmup in SWEEP_SCHEDULES: print(f'{lr:g} {warmup}')")
    [ "${#CANDIDATES[@]}" -gt 0 ] || { echo "gpu_job: resnmt.study.plan.SWEEP_SCHEDULES could not be read"; exit 1; }
    pids=()
    for candidate in "${CANDIDATES[@]}"; do
        read -r lr warmup <<< "$candidate"
        echo "[gpu_job] sweep: post-LN base, lr $lr, warm-up $warmup, to $SWEEP_MILESTONES updates"
        timeout -k 10 $(( $(left) - 40 )) "$PY" benchmarks/curves.py "${STUDY[@]}" --sizes base --only base:post_ln:1 \
            --lr "$lr" --warmup "$warmup" --milestones "$SWEEP_MILESTONES" --keep-checkpoints \
            > "$STUDY_WORK/logs/sweep-lr$lr-warmup$warmup.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || STUDY_RC=$?; done
    [ "$STUDY_RC" = 124 ] && STUDY_RC=0  # stopped at the budget: choose_schedule judges the newest shared milestone
    echo "[gpu_job] sweep done at $((SECONDS - T0)) s (exit $STUDY_RC)"
    study_done
    curves --sizes base,base12 "${STUDY_MILESTONES[@]}" --throughput | tee "$OUT/throughput.txt"
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
