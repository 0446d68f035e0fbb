#!/usr/bin/env bash
# One experiment end to end: prepare -> train -> average -> decode -> score.
# See usage() or docs/training.md.
set -euo pipefail

RN_NAME=run_experiment
# shellcheck source=scripts/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

usage() {
    cat <<'EOF'
Usage: scripts/run_experiment.sh [options] DATASET ARCH [-- FAIRSEQ-TRAIN FLAGS...]

Runs the papers' pipeline for one model, each step skipped when its output exists
(re-running the same command resumes an interrupted experiment or does nothing):

  1. prepare  data-prep/prepare-DATASET.sh DATA_ROOT     (skipped if DATA_ROOT/bin exists)
  2. train    scripts/train.sh (resumes from checkpoint_last.pt)    -> SAVE_DIR/train.done
  3. average  resnmt-average, the last N update checkpoints (checkpoint_E_U.pt,
              saved by the paper presets every 1000 updates) or, without them, the
              last N epoch checkpoints                              -> SAVE_DIR/checkpoint.avgN.pt
  4. decode   fairseq-generate --task resnmt_translation --gen-subset test
              --beam 4 --lenpen-form gnmt --lenpen 0.6              -> SAVE_DIR/gen.test.KEY.out
  5. score    resnmt-evaluate against DATA_ROOT/raw/test.TGT        -> SAVE_DIR/result.KEY.json,
              the same JSON object appended as one line to the --results file, and
              copied to SAVE_DIR/result.json (the latest settings' result)

KEY names the decoding settings, e.g. avg10.beam4.lenpen0.6 (plus .genNNN, a checksum,
with --gen-args): re-running with another --average, --beam, --lenpen or --gen-args
averages, decodes and scores again, keeping the earlier outputs.

DATASET and ARCH as for scripts/train.sh (--help there for the training options).

Options:
  --data-root DIR     prepared dataset directory (default: data/DATASET)
  --mirror DIR        local copy of the published files for the prepare script
                      (default for multi30k: ../shared/data/multi30k when it exists)
  --prep-args "A B"   more options for the prepare script (e.g. "--bpe-size 8000")
  --save-dir DIR      (default: runs/DATASET/ARCH[-TAG])
  --tag TAG, --preset P, --gpus N, --seed S, --max-update N, --max-epoch N,
  --max-tokens N, --tokens-per-update N
                      passed to scripts/train.sh
  --average N         checkpoints to average (default 10; fewer if fewer exist, with a note)
  --beam K            beam size (default 4)
  --lenpen A          GNMT length penalty alpha (default 0.6)
  --batch-size N      decoding batch size in sentences (default 128)
  --gen-args "A B"    more fairseq-generate flags (e.g. "--max-len-b 50")
  --results FILE      JSON lines file of all runs (default: runs/results.jsonl)
  -h, --help          this help

Scoring: sentencepiece data (multi30k, or --bpe sentencepiece) is decoded with
--post-process sentencepiece, BPE data with --post-process subword_nmt;
wmt14-en-de adds --detok moses --lang de --compound-split, wmt14-en-fr
--detok moses --lang fr (see docs/decoding-and-evaluation.md for the three BLEUs).
To redo a step, delete its output (e.g. SAVE_DIR/train.done after raising --max-update).
EOF
}

data_root= mirror= prep_args= save_dir= average=10 beam=4 lenpen=0.6 batch_size=128 gen_args=
results=runs/results.jsonl tag=
train_opts=() positional=() extra=()

while (($#)); do
    case $1 in
    -h | --help) usage; exit 0 ;;
    --data-root | --mirror | --prep-args | --save-dir | --average | --beam | --lenpen | --batch-size | --gen-args | --results)
        rn_need_value "$1" $#
        opt=${1#--}
        printf -v "${opt//-/_}" '%s' "$2"
        shift 2
        ;;
    --tag) rn_need_value "$1" $#; tag=$2; train_opts+=("$1" "$2"); shift 2 ;;
    --preset | --gpus | --seed | --max-update | --max-epoch | --max-tokens | --tokens-per-update)
        rn_need_value "$1" $#
        train_opts+=("$1" "$2")
        shift 2
        ;;
    --) shift; extra=("$@"); break ;;
    -*) rn_usage_error "unknown option '$1'" ;;
    *) positional+=("$1"); shift ;;
    esac
done
rn_dataset_arch "${positional[@]}"
rn_check_int --average "$average" 1
rn_check_int --beam "$beam" 1
rn_check_int --batch-size "$batch_size" 1
[[ $lenpen =~ ^[0-9]+(\.[0-9]+)?$ ]] || rn_usage_error "--lenpen '$lenpen': must be a number >= 0"
[[ -z $mirror || -d $mirror ]] || rn_usage_error "--mirror $mirror: no such directory"
rn_require_cmds resnmt-average resnmt-evaluate fairseq-generate

case $dataset in
iwslt15-en-vi | multi30k) eval_opts=() ;;
wmt14-en-de) eval_opts=(--detok moses --lang de --compound-split) ;;
wmt14-en-fr) eval_opts=(--detok moses --lang fr) ;;
esac
[[ -n $data_root ]] || data_root=data/$dataset
[[ -n $save_dir ]] || save_dir=runs/$dataset/$arch${tag:+-$tag}
if [[ -z $mirror && $dataset == multi30k && -d $RN_REPO_ROOT/../shared/data/multi30k ]]; then
    mirror=$RN_REPO_ROOT/../shared/data/multi30k
fi
train_cmd=(bash "$RN_SCRIPTS_DIR/train.sh" "${train_opts[@]}" --data "$data_root/bin" --save-dir "$save_dir"
    "$dataset" "$arch" -- "${extra[@]}")

# Every option of the training step is checked now, before any heavy work.
"${train_cmd[@]:0:2}" --dry-run "${train_cmd[@]:2}" >/dev/null ||
    rn_die "scripts/train.sh refused the training options (message above)"

started=$SECONDS
step() { rn_log "step $1/5: $2"; }

# ---------------------------------------------------------------------- 1. prepare
if [[ -e $data_root/bin/dict.$tgt.txt && -e $data_root/raw/test.$tgt ]]; then
    step 1 "prepare: $data_root/bin exists, skipped"
else
    step 1 "prepare $data_root"
    read -r -a prep <<<"$prep_args"
    bash "$RN_REPO_ROOT/data-prep/prepare-$dataset.sh" ${mirror:+--mirror "$mirror"} "${prep[@]}" "$data_root"
fi

# ---------------------------------------------------------------------- 2. train
if [[ -e $save_dir/train.done ]]; then
    step 2 "train: $save_dir/train.done exists, skipped"
else
    step 2 "train $arch into $save_dir"
    t0=$SECONDS
    "${train_cmd[@]}"
    printf '{"wall_seconds": %d}\n' $((SECONDS - t0)) | rn_atomic_write "$save_dir/train.done"
fi

# ---------------------------------------------------------------------- 3. average
shopt -s nullglob
update_ckpts=("$save_dir"/checkpoint_[0-9]*_[0-9]*.pt)
epoch_ckpts=("$save_dir"/checkpoint[0-9]*.pt)
shopt -u nullglob
if ((${#update_ckpts[@]})); then
    kind=update available=${#update_ckpts[@]}
else
    kind=epoch available=${#epoch_ckpts[@]}
fi
if ((available > 0)); then
    n=$((available < average ? available : average))
    label=avg$n
    avg=$save_dir/checkpoint.$label.pt
    if [[ -e $avg ]]; then
        step 3 "average: $avg exists, skipped"
    else
        step 3 "average the last $n $kind checkpoints -> $avg"
        ((n == average)) || rn_log "note: $available $kind checkpoint(s) in $save_dir, fewer than --average $average: averaging $n"
        resnmt-average --inputs "$save_dir" "--num-$kind-checkpoints" "$n" --output "$avg"
    fi
elif [[ -e $save_dir/checkpoint_last.pt ]]; then
    # training stopped (--max-update) before the end of epoch 1 and saved no numbered checkpoint
    n=1 kind=last label=last avg=$save_dir/checkpoint_last.pt
    step 3 "average: no epoch or update checkpoints in $save_dir, decoding checkpoint_last.pt alone"
else
    rn_die "no checkpoints in $save_dir"
fi

# ---------------------------------------------------------------------- 4. decode
if [[ -e $data_root/spm/spm.model ]]; then post=sentencepiece; else post=subword_nmt; fi
# every output below is named after what produced it (averaging, beam, length penalty,
# extra generate flags), so a re-run with other settings decodes and scores again
decode_key=$label.beam$beam.lenpen$lenpen
[[ -z $gen_args ]] || decode_key+=.gen$(printf '%s' "$gen_args" | cksum | cut -d' ' -f1)
gen=$save_dir/gen.test.$decode_key.out
if [[ -e $gen ]]; then
    step 4 "decode: $gen exists, skipped"
else
    step 4 "decode test with beam $beam, GNMT length penalty $lenpen -> $gen"
    read -r -a gen_extra <<<"$gen_args"
    t0=$SECONDS
    fairseq-generate "$data_root/bin" --user-dir "$(rn_user_dir)" --task resnmt_translation \
        --source-lang "$src" --target-lang "$tgt" --path "$avg" --gen-subset test \
        --beam "$beam" --lenpen-form gnmt --lenpen "$lenpen" --batch-size "$batch_size" \
        --post-process "$post" "${gen_extra[@]}" >"$gen.tmp.$$"
    mv -f "$gen.tmp.$$" "$gen"
    rn_log "decoded $(grep -c '^D-' "$gen") sentences in $(rn_fmt_secs $((SECONDS - t0)))"
fi

# ---------------------------------------------------------------------- 5. score
result=$save_dir/result.$decode_key.json
if [[ -e $result ]]; then
    step 5 "score: $result exists, skipped"
else
    step 5 "score against $data_root/raw/test.$tgt"
    scores=$save_dir/.evaluate.$$.jsonl
    rm -f "$scores"
    resnmt-evaluate --hyp "$gen" --ref "$data_root/raw/test.$tgt" "${eval_opts[@]}" --json-out "$scores"
    "$(rn_python)" - "$scores" "$save_dir" "$dataset" "$arch" "$avg" "$n" "$kind" "$beam" "$lenpen" "$result" <<'EOF'
import json, os, re, sys

scores, save_dir, dataset, arch, avg, n, kind, beam, lenpen, result = sys.argv[1:]
record = {"dataset": dataset, "arch": arch, "save_dir": os.path.abspath(save_dir),
          "params": None, "num_updates": None, "epochs": None, "train_seconds": 0.0}
# train.log holds fairseq's output of every (re)start of the training
with open(os.path.join(save_dir, "train.log"), encoding="utf-8", errors="replace") as f:
    for line in f:
        m = re.search(r"num\. (?:shared )?model params: ([\d,]+)", line)
        if m:
            record["params"] = int(m.group(1).replace(",", ""))
        m = re.search(r"\| epoch (\d+) \|.*\| num_updates (\d+) \|", line)
        if m:  # end-of-epoch statistics
            record["epochs"], record["num_updates"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"done training in ([\d.]+) seconds", line)
        if m:
            record["train_seconds"] = round(record["train_seconds"] + float(m.group(1)), 1)
with open(os.path.join(save_dir, "train.done")) as f:
    record["train_wall_seconds"] = json.load(f).get("wall_seconds")
record.update({"checkpoint": os.path.abspath(avg), "averaged": int(n), "averaged_kind": kind,
               "beam": int(beam), "lenpen": float(lenpen), "lenpen_form": "gnmt"})
with open(scores) as f:
    record.update(json.loads(f.read().strip().splitlines()[-1]))
tmp = result + ".tmp"
with open(tmp, "w") as f:
    json.dump(record, f)
    f.write("\n")
os.replace(tmp, result)
EOF
    rm -f "$scores"
    mkdir -p "$(dirname "$results")"
    cat "$result" >>"$results"
    rn_log "appended the result to $results"
fi
# result.json: the result of the latest settings (rewritten only when they changed)
cmp -s "$result" "$save_dir/result.json" || rn_atomic_write "$save_dir/result.json" <"$result"
"$(rn_python)" - "$result" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
parts = [f"BLEU {r['bleu']:.2f} ({r['signature']})", f"tokenized intl BLEU {r['tok_intl_bleu']:.2f}"]
if r.get("compound_split_bleu") is not None:
    parts.append(f"compound-split BLEU {r['compound_split_bleu']:.2f}")
if r.get("params"):
    parts.append(f"{r['params']:,} parameters")
parts.append(f"{r['num_updates']} updates, averaged {r['averaged']} {r['averaged_kind']} checkpoints")
print(f"{r['dataset']} {r['arch']}: " + ", ".join(parts))
EOF
rn_log "done in $(rn_fmt_secs $((SECONDS - started))): $result"
