# shellcheck shell=bash
# Shell functions of the data-prep/lib.sh framework (the prepare-*.sh scripts source it
# through data-prep/lib.sh). Sourced,
# not run. The calling script sets RN_NAME, the name its messages carry.
#
#   rn_log, rn_warn        a line on stderr, prefixed with [RN_NAME]
#   rn_die                 an error line on stderr, exit 1
#   rn_usage_error         an error line and a pointer to --help, exit 2
#   rn_fmt_secs SECONDS    12s / 3m05s / 1h02m
#   rn_require_cmds CMD... every CMD on PATH, or die naming the missing one

if [ -z "${BASH_VERSINFO:-}" ] || ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 3))); then
    echo "error: bash >= 4.3 is required (this is ${BASH_VERSION:-not bash})" >&2
    exit 1
fi

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

rn_require_cmds() {
    local cmd
    for cmd in "$@"; do
        command -v "$cmd" >/dev/null 2>&1 ||
            rn_die "'$cmd' not found on PATH (install the environment with 'make venv' and activate it: . .venv/bin/activate)"
    done
}
