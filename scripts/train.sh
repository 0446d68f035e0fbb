#!/usr/bin/env bash
# Train one resnmt (or fairseq transformer) model with the papers' settings.
# See usage() or docs/training.md.
set -euo pipefail

RN_NAME=train
# shellcheck source=scripts/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

usage() {
    cat <<'EOF'
Usage: scripts/train.sh [options] DATASET ARCH [-- FAIRSEQ-TRAIN FLAGS...]

Train ARCH on DATASET with fairseq-train --user-dir resnmt. Re-running the same
command resumes from SAVE_DIR/checkpoint_last.pt (fairseq's default restore file).

DATASET   iwslt15-en-vi (en->vi), wmt14-en-de (en->de), wmt14-en-fr (en->fr),
          multi30k (en->de); data from data-prep/prepare-DATASET.sh
ARCH      a registered arch of model resnmt_transformer
          (transformer_{postln,preln,xskip,rskip,sas,highway,deepnorm,rezero,admin}_{base,big},
          resnmt_transformer), or fairseq's 'transformer' for a baseline

Options:
  --data DIR            binarized data (default: data/DATASET/bin)
  --save-dir DIR        checkpoints, train.log (the output of every run, appended)
                        and train.cmd (the commands used) (default: runs/DATASET/ARCH[-TAG])
  --tag TAG             suffix of the default save dir (e.g. seed1)
  --preset P            paper: the papers' settings for DATASET and the arch's size
                        (default with GPUs); small: 2+2 layers d=128 FFN 512 for CPU
                        runs and demos (default without GPUs); cpu: small, forced
                        onto the CPU
  --gpus N              GPUs per node (default: all visible; 0 = CPU)
  --nodes N             nodes (default 1; N > 1 needs --launcher torchrun or slurm)
  --launcher L          none (default; fairseq spawns one process per GPU),
                        torchrun (run this script once per node with --node-rank),
                        slurm (run inside an allocation: srun, one task per node)
  --node-rank R         this node's rank, torchrun only (default 0)
  --master-addr HOST    torchrun rendezvous host (default 127.0.0.1)
  --master-port PORT    torchrun rendezvous / slurm port (default 29500)
  --seed S              random seed (default 1)
  --max-update N        stop after N updates (overrides the preset's)
  --max-epoch N         stop after N epochs (without --max-update it replaces the
                        preset's update limit)
  --max-tokens N        tokens per GPU per batch (overrides the preset's)
  --tokens-per-update N the effective batch the preset aims at; the script picks
                        --update-freq = max(1, round(N / (nodes*gpus*max-tokens)));
                        if one step over all GPUs already exceeds 4/3 N, it uses
                        --max-tokens ceil(N / (nodes*gpus)) and --update-freq 1
  --dry-run             print the command and exit (nothing is checked on disk
                        beyond the options, nothing is written)
  -h, --help            this help

Flags after -- go to fairseq-train after the preset's, so they override them
(argparse keeps the last value), e.g. -- --lr 1e-3 --skip-lambda 3.

Presets (paper): Adam (0.9, 0.98, eps 1e-9), inverse_sqrt with 4000 warm-up
updates, peak lr 7e-4 (base) / 5e-4 (big), label smoothing 0.1,
--share-all-embeddings, the arch's dropout (0.1 base, 0.3 big; 0.1 for big on
EN-FR as in Vaswani et al.), fp16 on GPU, --keep-last-epochs 10, and a
checkpoint every 1000 updates (the last 10 kept) for averaging;
  iwslt15-en-vi: 4096 tokens per update (1 GPU x 4096), 50k updates
  wmt14-*:       32768 tokens per update, base 100k / big 300k updates
Preset small: 4096 tokens per update, lr 1e-3, 500 warm-up updates, dropout 0.1,
2000 updates.
Environment: RESNMT_FAIRSEQ_TRAIN replaces the fairseq-train command (a wrapper);
PYTHON selects the interpreter used for checks.
EOF
}

# ---------------------------------------------------------------------- options

data= save_dir= tag= preset= gpus= nodes=1 launcher=none node_rank=0
master_addr=127.0.0.1 master_port=29500 seed=1 max_update= max_epoch=
max_tokens= tokens_per_update= dry_run=0
positional=() extra=()

while (($#)); do
    case $1 in
    -h | --help) usage; exit 0 ;;
    --dry-run) dry_run=1; shift ;;
    --data | --save-dir | --tag | --preset | --gpus | --nodes | --launcher | --node-rank | \
        --master-addr | --master-port | --seed | --max-update | --max-epoch | --max-tokens | --tokens-per-update)
        rn_need_value "$1" $#
        opt=${1#--}
        printf -v "${opt//-/_}" '%s' "$2"
        shift 2
        ;;
    --) shift; extra=("$@"); break ;;
    -*) rn_usage_error "unknown option '$1'" ;;
    *) positional+=("$1"); shift ;;
    esac
done

rn_dataset_arch "${positional[@]}"
[[ -z $preset ]] || rn_check_choice --preset "$preset" paper small cpu
rn_check_choice --launcher "$launcher" none torchrun slurm
rn_check_int --nodes "$nodes" 1
rn_check_int --node-rank "$node_rank" 0
rn_check_int --master-port "$master_port" 1
rn_check_int --seed "$seed" 0
[[ -z $gpus ]] || rn_check_int --gpus "$gpus" 0
[[ -z $max_update ]] || rn_check_int --max-update "$max_update" 1
[[ -z $max_epoch ]] || rn_check_int --max-epoch "$max_epoch" 1
[[ -z $max_tokens ]] || rn_check_int --max-tokens "$max_tokens" 1
[[ -z $tokens_per_update ]] || rn_check_int --tokens-per-update "$tokens_per_update" 1
((node_rank < nodes)) || rn_usage_error "--node-rank $node_rank must be < --nodes $nodes"
if ((nodes > 1)) && [[ $launcher == none ]]; then
    rn_usage_error "--nodes $nodes needs --launcher torchrun or --launcher slurm"
fi

read -r -a trainer <<<"${RESNMT_FAIRSEQ_TRAIN:-fairseq-train}"
((${#trainer[@]})) || rn_usage_error "RESNMT_FAIRSEQ_TRAIN is set but empty"
rn_require_cmds "${trainer[0]}"
python_bin=$(rn_python)

# The arch must be registered: resnmt_transformer's archs, or fairseq's transformer.
arch_check=$("$python_bin" - "$arch" <<'EOF'
import sys
import resnmt  # noqa: F401  registers the archs
from fairseq.models import ARCH_MODEL_NAME_REGISTRY
allowed = sorted(a for a, m in ARCH_MODEL_NAME_REGISTRY.items() if m == "resnmt_transformer") + ["transformer"]
print("ok" if sys.argv[1] in allowed else "allowed: " + " ".join(allowed))
EOF
) || rn_die "cannot import resnmt and fairseq with $python_bin"
[[ $arch_check == ok ]] || rn_usage_error "ARCH '$arch' is not a resnmt_transformer arch or 'transformer'; $arch_check"

# ---------------------------------------------------------------------- hardware

if [[ $preset == cpu ]]; then
    [[ -z $gpus || $gpus == 0 ]] || rn_usage_error "--preset cpu runs on the CPU; it cannot take --gpus $gpus"
    gpus=0
fi
detected=$(rn_count_gpus)
if [[ -z $gpus ]]; then
    gpus=$detected
    rn_log "GPUs: $gpus (detected; --gpus N to choose)"
elif ((gpus > detected)); then
    if ((dry_run)); then
        rn_warn "--gpus $gpus but $detected visible here (dry run: printing the command anyway)"
    else
        rn_usage_error "--gpus $gpus but only $detected GPU(s) visible here (nvidia-smi / CUDA_VISIBLE_DEVICES)"
    fi
fi
if ((gpus == 0)) && { ((nodes > 1)) || [[ $launcher != none ]]; }; then
    rn_usage_error "--launcher $launcher / --nodes $nodes need GPUs (--gpus N > 0)"
fi
[[ -n $preset ]] || { if ((gpus > 0)); then preset=paper; else preset=small; fi; }
[[ $preset == cpu ]] && preset=small
world=$((nodes * (gpus > 0 ? gpus : 1)))

# ---------------------------------------------------------------------- preset

size=base
[[ $arch == *_big ]] && size=big
common=(
    --task resnmt_translation --source-lang "$src" --target-lang "$tgt"
    --arch "$arch" --share-all-embeddings
    --optimizer adam --adam-betas '(0.9, 0.98)' --adam-eps 1e-09 --clip-norm 0.0 --weight-decay 0.0
    --lr-scheduler inverse_sqrt --warmup-init-lr 1e-07
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1
    --keep-last-epochs 10 --seed "$seed"
)
preset_flags=()
case $preset in
paper)
    if [[ $size == big ]]; then lr=5e-4 cap=3584; else lr=7e-4 cap=4096; fi
    # a checkpoint every 1000 updates, the last 10 kept: tensor2tensor's default
    # interval, whose last 10 checkpoints the papers averaged
    preset_flags+=(--lr "$lr" --warmup-updates 4000 --log-interval 100
        --save-interval-updates 1000 --keep-interval-updates 10)
    case $dataset in
    iwslt15-en-vi | multi30k) target=4096 preset_max_update=50000 ;;
    wmt14-*)
        target=32768
        if [[ $size == big ]]; then preset_max_update=300000; else preset_max_update=100000; fi
        # Vaswani et al. trained the EN-FR big model with dropout 0.1, not 0.3
        [[ $dataset == wmt14-en-fr && $size == big ]] && preset_flags+=(--dropout 0.1)
        ;;
    esac
    ;;
small)
    cap=4096 target=4096 preset_max_update=2000
    preset_flags+=(
        --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128
        --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512
        --encoder-attention-heads 4 --decoder-attention-heads 4 --dropout 0.1
        --lr 1e-3 --warmup-updates 500 --log-interval 50
    )
    ;;
esac
[[ -z $tokens_per_update ]] || target=$tokens_per_update
[[ -z $max_tokens ]] || cap=$max_tokens
# update-freq = max(1, round(target / (world * cap))); when one step over all GPUs
# already holds more than 4/3 of the target, shrink the per-GPU batch instead:
# max-tokens = ceil(target / world).
update_freq=$(((target + world * cap / 2) / (world * cap)))
((update_freq >= 1)) || update_freq=1
if ((update_freq == 1 && 3 * world * cap > 4 * target)); then
    cap=$(((target + world - 1) / world))
fi
per_update=$((world * cap * update_freq))
preset_flags+=(--max-tokens "$cap" --update-freq "$update_freq")
if [[ -n $max_update ]]; then
    preset_flags+=(--max-update "$max_update")
elif [[ -z $max_epoch ]]; then
    preset_flags+=(--max-update "$preset_max_update")
fi
[[ -z $max_epoch ]] || preset_flags+=(--max-epoch "$max_epoch")
if ((gpus == 0)); then
    preset_flags+=(--cpu)
elif [[ $preset == paper ]]; then
    preset_flags+=(--fp16)
fi

# ---------------------------------------------------------------------- paths

[[ -n $data ]] || data=data/$dataset/bin
[[ -n $save_dir ]] || save_dir=runs/$dataset/$arch${tag:+-$tag}
if ((!dry_run)); then
    [[ -d $data ]] || rn_die "data directory $data not found (prepare it: data-prep/prepare-$dataset.sh data/$dataset, or --data DIR)"
    for f in "dict.$src.txt" "dict.$tgt.txt" "train.$src-$tgt.$src.idx" "train.$src-$tgt.$tgt.idx" "valid.$src-$tgt.$src.idx"; do
        [[ -e $data/$f ]] || rn_die "$data/$f not found: $data is not $dataset data binarized for $src->$tgt"
    done
fi
user_dir=$(rn_user_dir)

# ---------------------------------------------------------------------- command

dist=()
launch=()
if ((gpus > 1 || nodes > 1)); then
    dist=(--distributed-world-size "$world")
    case $launcher in
    torchrun)
        # torchrun sets MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK/LOCAL_RANK; fairseq reads
        # them (infer_init_method) when no --distributed-init-method is given.
        rn_require_cmds torchrun
        launch=(torchrun --nnodes "$nodes" --nproc-per-node "$gpus" --node-rank "$node_rank"
            --master-addr "$master_addr" --master-port "$master_port")
        trainer=("$(command -v "${trainer[0]}")" "${trainer[@]:1}")
        ;;
    slurm)
        # One task per node; fairseq reads SLURM_* (scontrol for the first host) and
        # spawns one process per GPU, ranks node_id*gpus + local.
        rn_require_cmds srun
        launch=(srun --nodes "$nodes" --ntasks-per-node 1)
        dist+=(--distributed-port "$master_port")
        ;;
    esac
fi
cmd=("${launch[@]}" "${trainer[@]}" "$data" --user-dir "$user_dir" "${common[@]}" "${preset_flags[@]}"
    "${dist[@]}" --save-dir "$save_dir" --log-format simple
    "${extra[@]}")

rn_log "$dataset $src->$tgt, $arch ($size), preset $preset, $world process(es) ($((gpus)) GPU(s) x $nodes node(s))"
rn_log "batch: $world x max-tokens $cap x update-freq $update_freq = $per_update tokens per update (target $target)"
if ((dry_run)); then
    printf '%q ' "${cmd[@]}"
    printf '\n'
    exit 0
fi

mkdir -p "$save_dir"
rn_repair_checkpoint_last "$save_dir"
if [[ -e $save_dir/checkpoint_last.pt ]]; then
    rn_log "resuming from $save_dir/checkpoint_last.pt (written $(date -r "$save_dir/checkpoint_last.pt" '+%F %T'))"
else
    rn_log "starting a new run in $save_dir"
fi
cmd_text=$(printf '%q ' "${cmd[@]}")
if [[ -e $save_dir/train.cmd ]] && [[ $(tail -n 1 "$save_dir/train.cmd") != "$cmd_text" ]]; then
    rn_warn "this command differs from the last one used in $save_dir (see $save_dir/train.cmd)"
fi
printf '%s\n' "$cmd_text" >>"$save_dir/train.cmd"
rn_log "running: $cmd_text"
start=$SECONDS
# fairseq's own output, appended to SAVE_DIR/train.log as well (all restarts in one file)
"${cmd[@]}" 2>&1 | tee -a "$save_dir/train.log"
rn_log "done in $(rn_fmt_secs $((SECONDS - start))): $save_dir"
