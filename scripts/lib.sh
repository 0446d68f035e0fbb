# shellcheck shell=bash
# Shared functions of scripts/train.sh, scripts/run_experiment.sh and scripts/demo.sh.
# Sourced, not run. A script sets RN_NAME (the name used in messages) first.
#
#   logging      rn_log, rn_warn, rn_die (exit 1), rn_usage_error (exit 2), rn_fmt_secs
#   checks       rn_check_int, rn_check_choice, rn_require_cmds
#   environment  rn_python, rn_user_dir, rn_count_gpus
#   checkpoints  rn_checkpoint_ok, rn_repair_checkpoint_last
#   outputs      rn_atomic_write

if [ -z "${BASH_VERSINFO:-}" ] || ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 3))); then
    echo "error: bash >= 4.3 is required (this is ${BASH_VERSION:-not bash})" >&2
    exit 1
fi

RN_SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RN_REPO_ROOT=$(cd "$RN_SCRIPTS_DIR/.." && pwd)
RN_DATASETS=(iwslt15-en-vi wmt14-en-de wmt14-en-fr multi30k)

# ---------------------------------------------------------------------- logging

rn_log() { printf '[%s] %s\n' "$RN_NAME" "$*" >&2; }
rn_warn() { printf '[%s] warning: %s\n' "$RN_NAME" "$*" >&2; }

rn_die() {
    printf '[%s] error: %s\n' "$RN_NAME" "$*" >&2
    exit 1
}

rn_usage_error() {
    printf '[%s] error: %s\nRun %s --help for the options.\n' "$RN_NAME" "$*" "$RN_NAME.sh" >&2
    exit 2
}

rn_fmt_secs() {
    local s=$1
    if ((s >= 3600)); then
        printf '%dh%02dm' $((s / 3600)) $((s % 3600 / 60))
    elif ((s >= 60)); then
        printf '%dm%02ds' $((s / 60)) $((s % 60))
    else printf '%ds' "$s"; fi
}

# ---------------------------------------------------------------------- checks

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

rn_require_cmds() {
    local cmd
    for cmd in "$@"; do
        command -v "$cmd" >/dev/null 2>&1 ||
            rn_die "'$cmd' not found on PATH (activate the environment: make venv && . .venv/bin/activate)"
    done
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
