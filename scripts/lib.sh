# shellcheck shell=bash
# Shared functions of scripts/train.sh, scripts/run_experiment.sh and scripts/demo.sh.
# Sourced, not run. A script sets RN_NAME (the name used in messages) first.
#
#   from common.sh  rn_log, rn_warn, rn_die (exit 1), rn_usage_error (exit 2), rn_fmt_secs,
#                   rn_require_cmds
#   arguments    rn_need_value, rn_dataset_arch, rn_check_int, rn_check_choice
#   environment  rn_python, rn_user_dir, rn_count_gpus
#   checkpoints  rn_checkpoint_ok, rn_repair_checkpoint_last
#   outputs      rn_atomic_write

# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

RN_SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RN_REPO_ROOT=$(cd "$RN_SCRIPTS_DIR/.." && pwd)
RN_DATASETS=(iwslt15-en-vi wmt14-en-de wmt14-en-fr multi30k)

# ---------------------------------------------------------------------- checks

# rn_need_value OPTION NARGS: OPTION, seen with NARGS arguments left (itself included),
# must be followed by its value.
rn_need_value() { (($2 >= 2)) || rn_usage_error "$1 needs a value"; }

# rn_dataset_arch POSITIONAL...: the positional arguments must be exactly DATASET ARCH.
# Sets dataset, arch and the language pair src, tgt.
rn_dataset_arch() {
    (($# == 2)) || rn_usage_error "expected DATASET and ARCH, got $# argument(s): ${*:-none}"
    dataset=$1 arch=$2
    rn_check_choice DATASET "$dataset" "${RN_DATASETS[@]}"
    case $dataset in
    iwslt15-en-vi) src=en tgt=vi ;;
    wmt14-en-de | multi30k) src=en tgt=de ;;
    wmt14-en-fr) src=en tgt=fr ;;
    esac
}

# rn_check_int OPTION VALUE MIN: VALUE must be an integer >= MIN.
rn_check_int() {
    local opt=$1 value=$2 min=$3
    if ! [[ $value =~ ^[0-9]+$ ]] || ((10#$value < min)); then
        rn_usage_error "$opt '$value': must be an integer >= $min"
    fi
}

# rn_check_choice OPTION VALUE ALLOWED...
rn_check_choice() {
    local opt=$1 value=$2 choice
    shift 2
    for choice in "$@"; do [[ $value == "$choice" ]] && return 0; done
    rn_usage_error "$opt '$value' is not one of: $*"
}

# ---------------------------------------------------------------------- environment

# The python that has torch, fairseq and resnmt (PYTHON overrides).
rn_python() {
    if [[ -n ${PYTHON:-} ]]; then
        printf '%s\n' "$PYTHON"
    elif command -v python >/dev/null 2>&1; then
        command -v python
    else
        command -v python3 || rn_die "no python on PATH"
    fi
}

# Absolute path of the installed resnmt package: --user-dir must be absolute, a
# relative one breaks when fairseq is run from another directory.
rn_user_dir() {
    local py
    py=$(rn_python)
    # find_spec locates the package without importing it (importing resnmt imports fairseq)
    "$py" -c 'import importlib.util as u, os; print(os.path.dirname(os.path.abspath(u.find_spec("resnmt").origin)))' 2>/dev/null ||
        rn_die "cannot import resnmt with $py (make venv && . .venv/bin/activate, or set PYTHON)"
}

# Number of CUDA GPUs this process can use: 0 without nvidia-smi (fast path),
# else torch's count (which honours CUDA_VISIBLE_DEVICES).
rn_count_gpus() {
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo 0
        return
    fi
    "$(rn_python)" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0
}

# ---------------------------------------------------------------------- checkpoints

# rn_checkpoint_ok FILE: a complete torch zip file (the central directory at its
# end is intact). Reads only the directory, not the tensors: fast for any size.
rn_checkpoint_ok() {
    "$(rn_python)" - "$1" <<'EOF'
import sys, zipfile
try:
    with zipfile.ZipFile(sys.argv[1]) as z:
        names = z.namelist()
    sys.exit(0 if any(n.endswith("data.pkl") for n in names) else 1)
except Exception:
    sys.exit(1)
EOF
}

# rn_repair_checkpoint_last SAVE_DIR: fairseq writes checkpointN.pt atomically but
# then *copies* it to checkpoint_last.pt; a run killed during the copy leaves a
# truncated checkpoint_last.pt that stops every restart. Replace it by the newest
# complete checkpoint (the copy's source) and keep the broken file aside.
rn_repair_checkpoint_last() {
    local dir=$1 last="$1/checkpoint_last.pt" newest=
    [[ -e $last ]] || return 0
    rn_checkpoint_ok "$last" && return 0
    # shellcheck disable=SC2012  # names are fairseq's own: checkpoint<digits>[_<digits>].pt
    newest=$(ls -t "$dir"/checkpoint[0-9]*.pt 2>/dev/null | head -n 1 || true)
    mv -f "$last" "$last.broken"
    if [[ -n $newest ]] && rn_checkpoint_ok "$newest"; then
        cp "$newest" "$last.tmp" && mv -f "$last.tmp" "$last"
        rn_warn "$last was incomplete (a run killed while fairseq copied it); kept as $last.broken, replaced by $newest"
    else
        rn_warn "$last was incomplete and no other complete checkpoint exists; kept as $last.broken, training starts from scratch"
    fi
}

# ---------------------------------------------------------------------- outputs

# rn_atomic_write FILE: stdin to FILE.tmp.PID, renamed to FILE once complete.
rn_atomic_write() {
    local tmp="$1.tmp.$$"
    cat >"$tmp" && mv -f "$tmp" "$1"
}
