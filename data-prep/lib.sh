# shellcheck shell=bash
# Shared functions of the data-prep/prepare-*.sh scripts. Sourced, not run.
#
#   logging          rn_log, rn_die, rn_usage_error, rn_require_cmds (../scripts/common.sh)
#   options          dp_parse_args, dp_check_choice, dp_check_int
#   tools            dp_require_python_modules, dp_py (data-prep/textproc.py)
#   fetching         dp_fetch NAME URL: --mirror or download, sha256 check
#   steps            dp_run_steps: numbered steps, .done stamps, resume
#   outputs          dp_atomic, dp_binarize, dp_lines
#   WMT'14           dp_wmt14_main: the whole pipeline shared by EN-DE and EN-FR
#
# A script sets RN_NAME, declares its options in DP_OPT (name -> default; names
# listed in DP_FLAGS take no value), defines usage(), then calls dp_parse_args "$@".

# shellcheck source=../scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"

DP_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
declare -A DP_OPT=()       # option name -> value (defaults set by the script)
declare -A DP_FLAGS=()     # option names that take no value
declare -A DP_SHA256=()    # published file name -> expected sha256
declare -A DP_SHA256_FROM=()
declare -A DP_OUTPUTS=()   # step id -> its outputs (paths relative to OUTDIR), checked on re-runs
DP_READS_WORK=             # ids of the steps that read OUTDIR/work
DP_OUT=
DP_TMP=

# Help text of the options every script has (used by each script's usage()).
dp_common_help() {
    cat <<'EOF'
  --mirror DIR        read the published files (same names as published) from DIR
                      instead of downloading them (clusters without internet, tests)
  --mirror-url URL    download each file from URL/NAME instead of its published URL
  --checksums FILE    sha256 of published files, sha256sum format ("HASH  NAME");
                      overrides the hashes pinned in the script. After a run,
                      OUTDIR/orig/SHA256SUMS lists the hashes of the files it used.
  --workers N         parallel processes for tokenization, subword segmentation and
                      fairseq-preprocess (default: all cores, here NPROC)
  --keep-work         keep OUTDIR/work (intermediate files) after success
  -h, --help          this help

Re-running the same command skips finished steps (stamps in OUTDIR/.stamps) and
resumes an interrupted run; changing an option that affects the output for an
existing OUTDIR is refused (use a new OUTDIR). Progress goes to stderr.
EOF
}

# ---------------------------------------------------------------------- options

dp_nproc() { nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1; }

dp_set_common_defaults() {
    DP_OPT[mirror]=
    DP_OPT[mirror-url]=
    DP_OPT[checksums]=
    DP_OPT[workers]=$(dp_nproc)
    DP_OPT[keep-work]=0
    DP_FLAGS[keep-work]=1
}

_dp_set_opt() {
    local name=$1 value=$2
    [[ -v "DP_OPT[$name]" ]] || rn_usage_error "unknown option '--$name'"
    DP_OPT[$name]=$value
}

# dp_parse_args "$@": fills DP_OPT and DP_OUTDIR_ARG (the one positional argument).
dp_parse_args() {
    DP_OUTDIR_ARG=
    local name
    while (($#)); do
        case $1 in
            -h | --help)
                usage | sed "s/NPROC/$(dp_nproc)/"
                exit 0
                ;;
            --) shift; break ;;
            --*=*)
                name=${1%%=*}; name=${name#--}
                [[ -v "DP_FLAGS[$name]" ]] && rn_usage_error "option '--$name' takes no value"
                _dp_set_opt "$name" "${1#*=}"
                shift
                ;;
            --*)
                name=${1#--}
                if [[ -v "DP_FLAGS[$name]" ]]; then
                    DP_OPT[$name]=1
                    shift
                else
                    [[ -v "DP_OPT[$name]" ]] || rn_usage_error "unknown option '$1'"
                    (($# >= 2)) || rn_usage_error "option '$1' needs a value"
                    _dp_set_opt "$name" "$2"
                    shift 2
                fi
                ;;
            -?*) rn_usage_error "unknown option '$1'" ;;
            *)
                [[ -z $DP_OUTDIR_ARG ]] || rn_usage_error "unexpected argument '$1' (OUTDIR is already '$DP_OUTDIR_ARG'; one OUTDIR only)"
                DP_OUTDIR_ARG=$1
                shift
                ;;
        esac
    done
    if (($#)); then
        [[ -z $DP_OUTDIR_ARG && $# -eq 1 ]] || rn_usage_error "one OUTDIR only, got: $*"
        DP_OUTDIR_ARG=$1
    fi
    [[ -n $DP_OUTDIR_ARG ]] || rn_usage_error "missing OUTDIR (the output directory)"
    dp_check_int workers 1
    if [[ -n ${DP_OPT[mirror]} ]]; then
        [[ -d ${DP_OPT[mirror]} ]] || rn_usage_error "--mirror ${DP_OPT[mirror]}: no such directory"
        [[ -r ${DP_OPT[mirror]} && -x ${DP_OPT[mirror]} ]] || rn_usage_error "--mirror ${DP_OPT[mirror]}: directory not readable"
        DP_OPT[mirror]=$(cd "${DP_OPT[mirror]}" && pwd)
    fi
    if [[ -n ${DP_OPT[mirror]} && -n ${DP_OPT[mirror-url]} ]]; then
        rn_usage_error "--mirror and --mirror-url exclude each other"
    fi
    if [[ -n ${DP_OPT[checksums]} ]]; then
        [[ -f ${DP_OPT[checksums]} && -r ${DP_OPT[checksums]} ]] || rn_usage_error "--checksums ${DP_OPT[checksums]}: no such readable file"
    fi
}

# The subword and length-filter options of the IWSLT and WMT scripts, with the papers'
# defaults: --bpe subword-nmt, --bpe-size 32000, --spm-type unigram, --max-len 250,
# --max-train-lines 0 (all). Set before dp_parse_args, checked after it.
dp_subword_option_defaults() {
    DP_OPT[bpe]=subword-nmt
    DP_OPT[bpe-size]=32000
    DP_OPT[spm-type]=unigram
    DP_OPT[max-len]=250
    DP_OPT[max-train-lines]=0
}

dp_check_subword_options() {
    dp_check_choice bpe subword-nmt sentencepiece
    dp_check_int bpe-size 1
    dp_check_choice spm-type unigram bpe
    dp_check_int max-len 1
    dp_check_int max-train-lines 0
}

# dp_keep_raw LANG...: OUTDIR/raw/{valid,test}.LANG, byte-for-byte copies of the work
# files as published (the sources to translate and the sacreBLEU references).
dp_keep_raw() {
    local split l
    mkdir -p "$DP_OUT/raw"
    for split in valid test; do
        for l in "$@"; do dp_atomic "$DP_OUT/raw/$split.$l" cat "$DP_WORK/$split.$l"; done
    done
}

# dp_check_choice NAME ALLOWED...: the value of --NAME must be one of ALLOWED.
dp_check_choice() {
    local name=$1 v; shift
    for v in "$@"; do [[ ${DP_OPT[$name]} == "$v" ]] && return 0; done
    rn_usage_error "--$name '${DP_OPT[$name]}' is not allowed; choose one of: $*"
}

# dp_check_int NAME MIN: the value of --NAME must be an integer >= MIN.
dp_check_int() {
    local name=$1 min=$2 v=${DP_OPT[$1]}
    [[ $v =~ ^[0-9]+$ ]] || rn_usage_error "--$name '$v' is not an integer (expected an integer >= $min)"
    ((10#$v >= min)) || rn_usage_error "--$name $v is too small (expected an integer >= $min)"
    DP_OPT[$name]=$((10#$v))
}

# ------------------------------------------------------------------------ tools

# dp_require_python_modules MOD...: find python (PYTHON, python3, python) with these modules.
dp_require_python_modules() {
    if [[ -n ${PYTHON:-} ]]; then
        DP_PYTHON=$PYTHON
        command -v "$DP_PYTHON" >/dev/null 2>&1 || rn_die "PYTHON=$PYTHON: not found"
    elif command -v python3 >/dev/null 2>&1; then
        DP_PYTHON=python3
    elif command -v python >/dev/null 2>&1; then
        DP_PYTHON=python
    else
        rn_die "no python3 on PATH"
    fi
    local missing
    missing=$("$DP_PYTHON" - "$@" <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
EOF
    ) || rn_die "$DP_PYTHON does not run"
    [[ -z $missing ]] || rn_die "python module(s) missing in $(command -v "$DP_PYTHON"): $missing (install requirements.txt, e.g. 'make venv', and activate .venv, or set PYTHON=/path/to/venv/bin/python)"
}

# dp_py SUBCOMMAND ARGS...: run data-prep/textproc.py.
dp_py() { DATAPREP_TAG=$RN_NAME "$DP_PYTHON" "$DP_LIB_DIR/textproc.py" "$@"; }

dp_sha256() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        shasum -a 256 "$1" | cut -d' ' -f1
    fi
}

# ------------------------------------------------------------------------ setup

# dp_setup: create OUTDIR, take its lock, record the options that shape the output.
# Arguments: the option names whose values change the output (compared on re-runs).
dp_setup() {
    mkdir -p "$DP_OUTDIR_ARG" || rn_die "cannot create OUTDIR $DP_OUTDIR_ARG"
    DP_OUT=$(cd "$DP_OUTDIR_ARG" && pwd)
    [[ -w $DP_OUT ]] || rn_die "OUTDIR $DP_OUT is not writable"
    DP_ORIG=$DP_OUT/orig
    DP_WORK=$DP_OUT/work
    DP_STAMPS=$DP_OUT/.stamps
    mkdir -p "$DP_ORIG" "$DP_WORK" "$DP_STAMPS"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$DP_OUT/.lock"
        flock -n 9 || rn_die "another prepare run is using $DP_OUT (lock $DP_OUT/.lock)"
    fi
    # temporaries of a run that was killed (we hold the lock: no other run owns them)
    find "$DP_OUT" -maxdepth 1 -name '.tmp.*' -type d -exec rm -rf {} +
    find "$DP_OUT" -maxdepth 3 -name '*.tmp' -type f -delete
    DP_TMP=$(mktemp -d "$DP_OUT/.tmp.XXXXXX")
    trap '_dp_on_exit $?' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    local config="" name
    for name in "$@"; do config+="$name=${DP_OPT[$name]}"$'\n'; done
    if [[ -f $DP_STAMPS/config ]]; then
        if [[ $(cat "$DP_STAMPS/config") != "${config%$'\n'}" ]]; then
            rn_die "$DP_OUT was prepared with other options:
$(diff <(cat "$DP_STAMPS/config") <(printf '%s' "$config") | sed -n 's/^< /  before: --/p; s/^> /  now:    --/p')
use a new OUTDIR, or delete $DP_OUT to start over"
        fi
    else
        printf '%s' "$config" >"$DP_STAMPS/config"
    fi

    if [[ -n ${DP_OPT[checksums]} ]]; then
        local hash fname n=0
        while read -r hash fname; do
            [[ -z $hash || $hash == \#* ]] && continue
            [[ $hash =~ ^[0-9a-fA-F]{64}$ ]] || rn_die "--checksums ${DP_OPT[checksums]}: '$hash' is not a sha256 (expected lines 'HASH  NAME')"
            fname=${fname#\*}
            DP_SHA256[$fname]=${hash,,}
            DP_SHA256_FROM[$fname]="--checksums ${DP_OPT[checksums]}"
            n=$((n + 1))
        done <"${DP_OPT[checksums]}"
        ((n > 0)) || rn_die "--checksums ${DP_OPT[checksums]}: no 'HASH  NAME' line"
    fi
}

_dp_on_exit() {
    local rc=$1
    [[ -n $DP_TMP ]] && rm -rf "$DP_TMP"
    if ((rc != 0)) && [[ -n ${DP_CURRENT_STEP:-} ]]; then
        local what=failed
        ((rc == 130 || rc == 143)) && what=interrupted
        printf '[%s] %s in step %s (exit %d); outputs of finished steps are kept, re-run the same command to resume\n' \
            "$RN_NAME" "$what" "$DP_CURRENT_STEP" "$rc" >&2
    fi
}

# dp_pin NAME SHA256: a published file's known hash (only for files we verified).
dp_pin() {
    [[ -v "DP_SHA256[$1]" ]] && return 0 # --checksums wins
    DP_SHA256[$1]=$2
    DP_SHA256_FROM[$1]="pinned in $RN_NAME.sh"
}

# --------------------------------------------------------------------- fetching

# _dp_verify FILE NAME: check FILE against the known sha256 of NAME (if any) and
# record its hash; on a mismatch set DP_VERIFY_ERR and return 1.
_dp_verify() {
    local file=$1 name=$2 actual
    [[ -r $file ]] || rn_die "cannot read $file"
    actual=$(dp_sha256 "$file") || rn_die "cannot read $file"
    if [[ -v "DP_SHA256[$name]" ]]; then
        if [[ $actual != "${DP_SHA256[$name]}" ]]; then
            DP_VERIFY_ERR="checksum mismatch for $name ($file): sha256 is $actual, expected ${DP_SHA256[$name]} (${DP_SHA256_FROM[$name]})"
            return 1
        fi
        rn_log "  $name: sha256 OK"
    else
        rn_log "  $name: sha256 $actual (not pinned: no published hash is known; pass --checksums to pin it)"
    fi
    printf '%s  %s\n' "$actual" "$name" >>"$DP_TMP/SHA256SUMS"
}

# dp_fetch NAME URL: make $DP_ORIG/NAME the verified published file (a symlink
# into --mirror, or a download that is renamed into place only once verified).
dp_fetch() {
    local name=$1 url=$2 dest=$DP_ORIG/$1
    if [[ -n ${DP_OPT[mirror]} ]]; then
        local src=${DP_OPT[mirror]}/$name
        [[ -e $src ]] || rn_die "$name not found in mirror ${DP_OPT[mirror]} (a mirror holds the published files under their published names; expected $src)"
        [[ -f $src && -r $src ]] || rn_die "cannot read $src"
        _dp_verify "$src" "$name" || rn_die "$DP_VERIFY_ERR"
        ln -sfn "$src" "$dest"
        return 0
    fi
    if [[ -f $dest && ! -L $dest ]]; then
        rn_log "  $name: already downloaded"
        _dp_verify "$dest" "$name" || rn_die "$DP_VERIFY_ERR (delete it to download it again)"
        return 0
    fi
    rm -f "$dest"
    [[ -n ${DP_OPT[mirror-url]} ]] && url=${DP_OPT[mirror-url]%/}/$name
    rn_log "  $name: downloading $url"
    local part=$dest.part rc=0
    if command -v curl >/dev/null 2>&1; then
        curl -fL --retry 3 --retry-delay 5 --connect-timeout 30 -C - --progress-bar -o "$part" "$url" || rc=$?
        if ((rc == 33)); then # the server cannot resume the partial download: start over
            rm -f "$part"
            rc=0
            curl -fL --retry 3 --retry-delay 5 --connect-timeout 30 --progress-bar -o "$part" "$url" || rc=$?
        fi
    elif command -v wget >/dev/null 2>&1; then
        wget -c --tries=3 --timeout=30 -O "$part" "$url" || rc=$?
    else
        rn_die "neither curl nor wget on PATH: install one, or fetch the files yourself and pass --mirror DIR"
    fi
    ((rc == 0)) || rn_die "download of $url failed (exit $rc); partial data kept in $part, re-run to resume"
    if ! _dp_verify "$part" "$name"; then
        mv -f "$part" "$part.bad"
        rn_die "$DP_VERIFY_ERR; the download is kept as $part.bad"
    fi
    mv -f "$part" "$dest"
}

# dp_fetch_all NAME URL [NAME URL ...]; writes OUTDIR/orig/SHA256SUMS.
dp_fetch_all() {
    : >"$DP_TMP/SHA256SUMS"
    while (($#)); do
        dp_fetch "$1" "$2"
        shift 2
    done
    mv -f "$DP_TMP/SHA256SUMS" "$DP_ORIG/SHA256SUMS"
}

# ------------------------------------------------------------------------ steps

# dp_run_steps ID "DESCRIPTION" FUNCTION [ID "DESCRIPTION" FUNCTION ...]
# Runs the steps in order. A step is skipped when its stamp OUTDIR/.stamps/NN-ID.done
# exists and the outputs listed in DP_OUTPUTS[ID] exist; otherwise it runs, and so
# do all the steps after it. OUTDIR/work (intermediate files) is removed after a
# complete run unless --keep-work: when a step that reads work/ (its id listed in
# DP_READS_WORK) must be redone and work/ is empty, every step after the
# download is redone.
dp_run_steps() {
    local -a ids descs fns
    while (($#)); do
        ids+=("$1") descs+=("$2") fns+=("$3")
        shift 3
    done
    local n=${#ids[@]} i s missing redo=0 t0 start=$SECONDS
    local -a m
    for ((i = 1; i <= n; i++)); do
        missing=
        for s in ${DP_OUTPUTS[${ids[i - 1]}]:-}; do [[ -e $DP_OUT/$s ]] || missing+=" $s"; done
        if [[ ! -e $(_dp_stamp "$i") ]]; then
            redo=$i
            break
        elif [[ -n $missing ]]; then
            read -ra m <<<"$missing"
            rn_log "step $i/$n: done earlier, but its output is missing: ${m[*]:0:2}${m[2]:+ ...}"
            redo=$i
            break
        fi
    done
    if ((redo > 2)) && [[ " $DP_READS_WORK " == *" ${ids[redo - 1]} "* && -z $(ls -A "$DP_WORK") ]]; then
        rn_log "step $redo/$n reads OUTDIR/work, removed after the last complete run (see --keep-work): redoing steps 2-$n"
        redo=2
    fi
    if ((redo == 0)); then
        for ((i = 1; i <= n; i++)); do rn_log "step $i/$n: ${descs[i - 1]}: done, skipping"; done
        rmdir "$DP_WORK" 2>/dev/null || true
        rn_log "nothing to do: $DP_OUT is complete (binarized data in $DP_OUT/bin)"
        return 0
    fi
    for ((i = redo; i <= n; i++)); do rm -f "$(_dp_stamp "$i")"; done
    for ((i = 1; i <= n; i++)); do
        if ((i < redo)); then
            rn_log "step $i/$n: ${descs[i - 1]}: done, skipping"
            continue
        fi
        DP_CURRENT_STEP="$i/$n (${descs[i - 1]})"
        rn_log "step $i/$n: ${descs[i - 1]}"
        t0=$SECONDS
        "${fns[i - 1]}"
        touch "$DP_STAMPS/$(printf '%02d' "$i")-${ids[i - 1]}.done"
        DP_CURRENT_STEP=
        rn_log "step $i/$n: done in $(rn_fmt_secs $((SECONDS - t0)))"
    done
    if ((DP_OPT[keep-work] == 0)); then rm -rf "$DP_WORK"; fi
    rn_log "finished in $(rn_fmt_secs $((SECONDS - start))): binarized data in $DP_OUT/bin"
}

_dp_stamp() { # _dp_stamp I: the stamp file of step I (any id)
    local f
    for f in "$DP_STAMPS/$(printf '%02d' "$1")"-*.done; do
        echo "$f"
        return 0
    done
}

# ---------------------------------------------------------------------- outputs

# dp_atomic DEST CMD ARGS...: run CMD with stdout to a temporary file, rename to DEST.
dp_atomic() {
    local dest=$1 tmp
    shift
    mkdir -p "$(dirname "$dest")"
    tmp=$dest.$$.tmp
    if ! "$@" >"$tmp"; then
        rm -f "$tmp"
        return 1
    fi
    mv -f "$tmp" "$dest"
}

# dp_lines FILE: number of lines (a last line without newline counts); .gz decompressed.
dp_lines() {
    if [[ $1 == *.gz ]]; then
        gzip -dc "$1" | awk 'END { print NR }'
    else
        awk 'END { print NR }' "$1"
    fi
}

# dp_same_lines FILE...: fail unless all have the same number of lines; prints it.
dp_same_lines() {
    local f n first=
    for f in "$@"; do
        n=$(dp_lines "$f") || rn_die "cannot read $f"
        if [[ -z $first ]]; then
            first=$n
        elif [[ $n != "$first" ]]; then
            rn_die "parallel files differ in length: $1 has $first lines, $f has $n"
        fi
    done
    echo "$first"
}

# dp_gunzip SRC.gz DEST: decompress atomically; a corrupt archive is an error naming it.
dp_gunzip() {
    dp_atomic "$2" gzip -dc "$1" || rn_die "cannot decompress $1 (corrupt or truncated gzip?)"
}

# dp_extract ARCHIVE DESTDIR MEMBER...: extract the named members (tar -xf, any compression).
dp_extract() {
    local archive=$1 dest=$2 err
    shift 2
    mkdir -p "$dest"
    if ! err=$(tar -xf "$archive" -C "$dest" "$@" 2>&1); then
        rn_die "cannot extract from $archive ($(basename "$archive")): ${err//$'\n'/; }
  (members needed: $*; a corrupt or truncated download? delete it and re-run)"
    fi
}

# Subword segmentation with method DP_BPE (subword-nmt | sentencepiece) and the
# options bpe-size, spm-type, workers. The model goes to OUTDIR/bpe/bpe.codes or
# OUTDIR/spm/spm.model (kept: evaluation decodes with it).
dp_subword_model_path() { echo "$DP_OUT/$(dp_subword_model_rel)"; }
dp_subword_model_rel() {
    if [[ $DP_BPE == sentencepiece ]]; then echo spm/spm.model; else echo bpe/bpe.codes; fi
}

# dp_bin_outputs SRC TGT: the files of OUTDIR/bin (for DP_OUTPUTS)
dp_bin_outputs() {
    local split l
    printf 'bin/dict.%s.txt bin/dict.%s.txt' "$1" "$2"
    for split in train valid test; do
        for l in "$1" "$2"; do printf ' bin/%s.%s-%s.%s.bin bin/%s.%s-%s.%s.idx' "$split" "$1" "$2" "$l" "$split" "$1" "$2" "$l"; done
    done
}

dp_learn_subword() { # dp_learn_subword INPUT...
    dp_py subword-learn --method "$DP_BPE" --size "${DP_OPT[bpe-size]}" \
        --spm-type "${DP_OPT[spm-type]:-unigram}" --workers "${DP_OPT[workers]}" \
        -o "$(dp_subword_model_path)" "$@"
}

dp_apply_subword() { # dp_apply_subword IN OUT [IN OUT ...]
    dp_py subword-apply --method "$DP_BPE" --model "$(dp_subword_model_path)" \
        --workers "${DP_OPT[workers]}" "$@"
}

# dp_binarize SRC TGT TEXTDIR: fairseq-preprocess TEXTDIR/{train,valid,test}.{SRC,TGT}
# into OUTDIR/bin with a joined dictionary (built on a temporary name, then renamed).
dp_binarize() {
    local src=$1 tgt=$2 text=$3 tmpbin=$DP_TMP/bin log=$DP_OUT/logs/fairseq-preprocess.log
    local lines workers=${DP_OPT[workers]}
    # fairseq-preprocess workers re-read the dictionary and pay a start-up cost:
    # measured here, 2 workers are slower than 1 on Multi30k's 29K pairs. One
    # worker per 250K training pairs.
    lines=$(dp_lines "$text/train.$src")
    ((workers > 1 + lines / 250000)) && workers=$((1 + lines / 250000))
    mkdir -p "$DP_OUT/logs"
    if ! fairseq-preprocess --source-lang "$src" --target-lang "$tgt" \
        --trainpref "$text/train" --validpref "$text/valid" --testpref "$text/test" \
        --destdir "$tmpbin" --joined-dictionary --workers "$workers" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rn_die "fairseq-preprocess failed (full log: $log)"
    fi
    sed -nE 's/^.*(\[[a-z]+\]) (.*: [0-9]+ sents.*)$/  \1 \2/p; s/^.*(\[[a-z]+\] Dictionary: .*)$/  \1/p' "$log" | awk '!seen[$0]++' >&2
    rm -rf "${DP_OUT:?}/bin"
    mv "$tmpbin" "$DP_OUT/bin"
}

# dp_write_info: OUTDIR/prepare-info.txt (what was run, with which tools, line counts).
dp_write_info() {
    local f
    {
        echo "# written by data-prep/$RN_NAME.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "options:"
        sed 's/^/  /' "$DP_STAMPS/config"
        echo "  mirror=${DP_OPT[mirror]:-${DP_OPT[mirror-url]:-(published URLs)}}"
        echo "tools: $("$DP_PYTHON" -c 'import importlib.metadata as m; print(" ".join(f"{p}=={m.version(p)}" for p in ("sacremoses", "subword-nmt", "sentencepiece", "ve-fairseq")))' 2>/dev/null || echo unknown)"
        echo "lines (segmented text given to fairseq-preprocess):"
        for f in "$DP_OUT"/text/*; do printf '  %s %s\n' "$(basename "$f")" "$(dp_lines "$f")"; done
    } >"$DP_TMP/prepare-info.txt"
    mv -f "$DP_TMP/prepare-info.txt" "$DP_OUT/prepare-info.txt"
}

# ------------------------------------------------------------------------ WMT'14
#
# dp_wmt14_main "$@": the pipeline shared by prepare-wmt14-en-de.sh and
# prepare-wmt14-en-fr.sh. The calling script sets:
#   RN_NAME, WMT_TGT (de | fr), WMT_TGT_NAME, WMT_DEV_NAME, WMT_DEFAULT_RATIO
#   WMT_FILES  (NAME URL ...)               archives to fetch
#   WMT_TRAIN  ("ARCHIVE|PREFIX|SUFFIX" ...) training corpora: members PREFIX.LANG SUFFIX
#   WMT_DEV    ("ARCHIVE|PREFIX" ...)        dev sets, plain text PREFIX.LANG, concatenated
#   WMT_TEST   "ARCHIVE|SRC.sgm|REF.sgm"     newstest2014 source and reference
# and defines usage() (which may call dp_wmt14_usage).

dp_wmt14_usage() {
    local t=$WMT_TGT i
    cat <<EOF
Usage: data-prep/$RN_NAME.sh [options] [--mirror DIR] OUTDIR

WMT'14 English->$WMT_TGT_NAME: the standard training corpora; Moses punctuation
normalization, non-printing character removal and tokenization (sacremoses,
aggressive hyphen splitting, as fairseq's prepare-wmt14en2$t.sh); joint subwords
learned on the tokenized training text; training pairs cleaned like Moses
clean-corpus-n (1..--max-len subwords, length ratio <= --ratio); and
fairseq-preprocess --joined-dictionary (so --share-all-embeddings works).
Dev: $WMT_DEV_NAME; test: newstest2014 (the full 3,003-sentence set in
test-full.tgz). Dev and test are never cleaned.

Outputs:
  OUTDIR/bin/                fairseq data (train/valid/test, en-$t, dict.{en,$t}.txt)
  OUTDIR/bpe/bpe.codes       subword-nmt codes (or OUTDIR/spm/spm.model)
  OUTDIR/raw/test.{en,$t}    newstest2014 source/reference, untokenized, identical to
                             sacreBLEU's wmt14/full (the references for sacreBLEU)
  OUTDIR/raw/valid.{en,$t}   the dev set, untokenized
  OUTDIR/text/               the segmented text given to fairseq-preprocess

Options:
  --bpe METHOD        subword-nmt (joint BPE) or sentencepiece (default: subword-nmt)
  --bpe-size N        BPE merge operations, or sentencepiece vocabulary size
                      (default: 32000, like the papers' tensor2tensor 32k vocabulary;
                      fairseq's prepare-wmt14en2$t.sh uses 40000)
  --spm-type T        sentencepiece model type: unigram or bpe (default: unigram)
  --max-len N         clean: drop training pairs longer than N subwords (default: 250)
  --ratio R           clean: drop training pairs whose length ratio exceeds R
                      (default: $WMT_DEFAULT_RATIO; 0: no ratio test)
  --max-train-lines N use only the first N lines of each training corpus (0: all;
                      a quick smoke test of the whole pipeline)
EOF
    dp_common_help
    echo
    echo "Files (not sha256-pinned, see --checksums):"
    for ((i = 0; i < ${#WMT_FILES[@]}; i += 2)); do printf '  %-36s %s\n' "${WMT_FILES[i]}" "${WMT_FILES[i + 1]}"; done
}

dp_wmt14_main() {
    dp_set_common_defaults
    dp_subword_option_defaults
    DP_OPT[ratio]=$WMT_DEFAULT_RATIO
    dp_parse_args "$@"
    dp_check_subword_options
    if ! [[ ${DP_OPT[ratio]} =~ ^[0-9]+(\.[0-9]*)?$ ]] ||
        ! awk -v r="${DP_OPT[ratio]}" 'BEGIN { exit !(r == 0 || r >= 1) }'; then
        rn_usage_error "--ratio '${DP_OPT[ratio]}' is not allowed: expected a number >= 1, or 0 for no ratio test"
    fi
    DP_BPE=${DP_OPT[bpe]}

    rn_require_cmds tar gzip fairseq-preprocess
    local module=subword_nmt i
    [[ $DP_BPE == sentencepiece ]] && module=sentencepiece
    dp_require_python_modules sacremoses regex "$module"
    dp_setup bpe bpe-size spm-type max-len ratio max-train-lines

    local t=$WMT_TGT
    DP_OUTPUTS[fetch]=$(for ((i = 0; i < ${#WMT_FILES[@]}; i += 2)); do printf 'orig/%s ' "${WMT_FILES[i]}"; done)
    DP_OUTPUTS[raw]="raw/valid.en raw/valid.$t raw/test.en raw/test.$t"
    DP_OUTPUTS[learn]=$(dp_subword_model_rel)
    DP_OUTPUTS[apply]="text/valid.en text/valid.$t text/test.en text/test.$t"
    DP_OUTPUTS[clean]="text/train.en text/train.$t"
    DP_OUTPUTS[binarize]=$(dp_bin_outputs en "$t")
    DP_READS_WORK="raw tokenize learn apply clean"
    dp_run_steps \
        fetch "fetch and verify $((${#WMT_FILES[@]} / 2)) archives" _dp_wmt14_fetch \
        extract "extract the corpora, check line counts" _dp_wmt14_extract \
        raw "raw dev/test text (newstest2014 from SGM, as sacreBLEU)" _dp_wmt14_raw \
        tokenize "normalize punctuation and tokenize (sacremoses, ${DP_OPT[workers]} workers)" _dp_wmt14_tokenize \
        learn "learn joint $DP_BPE subwords (size ${DP_OPT[bpe-size]}) on train.en + train.$WMT_TGT" _dp_wmt14_learn \
        apply "segment train/valid/test" _dp_wmt14_apply \
        clean "clean training pairs (1..${DP_OPT[max-len]} subwords, ratio ${DP_OPT[ratio]})" _dp_wmt14_clean \
        binarize "fairseq-preprocess --joined-dictionary" _dp_wmt14_binarize
}

_dp_wmt14_fetch() { dp_fetch_all "${WMT_FILES[@]}"; }

# "ARCHIVE MEMBER" for every member the pipeline reads, in order
_dp_wmt14_members() {
    local spec archive prefix suffix l
    for spec in "${WMT_TRAIN[@]}"; do
        IFS='|' read -r archive prefix suffix <<<"$spec"
        for l in en "$WMT_TGT"; do echo "$archive $prefix.$l$suffix"; done
    done
    for spec in "${WMT_DEV[@]}"; do
        IFS='|' read -r archive prefix <<<"$spec"
        for l in en "$WMT_TGT"; do echo "$archive $prefix.$l"; done
    done
    IFS='|' read -r archive prefix suffix <<<"$WMT_TEST"
    echo "$archive $prefix"
    echo "$archive $suffix"
}

_dp_wmt14_extract() {
    local x=$DP_WORK/extracted archive spec prefix suffix n
    local -a archives members
    rm -rf "$x"
    mkdir -p "$x"
    mapfile -t archives < <(_dp_wmt14_members | cut -d' ' -f1 | awk '!seen[$0]++')
    for archive in "${archives[@]}"; do
        mapfile -t members < <(_dp_wmt14_members | awk -v a="$archive" '$1 == a { print $2 }')
        rn_log "  $archive: ${members[*]}"
        dp_extract "$DP_ORIG/$archive" "$x" "${members[@]}"
    done
    for spec in "${WMT_TRAIN[@]}"; do
        IFS='|' read -r archive prefix suffix <<<"$spec"
        n=$(dp_same_lines "$x/$prefix.en$suffix" "$x/$prefix.$WMT_TGT$suffix")
        ((n > 0)) || rn_die "$prefix.en$suffix in $archive is empty"
        rn_log "  $(basename "$prefix"): $n pairs"
    done
}

_dp_wmt14_raw() {
    local x=$DP_WORK/extracted archive prefix src ref spec l n
    local -a files
    mkdir -p "$DP_OUT/raw"
    IFS='|' read -r archive src ref <<<"$WMT_TEST"
    dp_py sgm2txt "$x/$src" "$DP_OUT/raw/test.en"
    dp_py sgm2txt "$x/$ref" "$DP_OUT/raw/test.$WMT_TGT"
    for l in en "$WMT_TGT"; do
        files=()
        for spec in "${WMT_DEV[@]}"; do
            IFS='|' read -r archive prefix <<<"$spec"
            files+=("$x/$prefix.$l")
        done
        dp_atomic "$DP_OUT/raw/valid.$l" cat "${files[@]}"
    done
    n=$(dp_same_lines "$DP_OUT/raw/test.en" "$DP_OUT/raw/test.$WMT_TGT")
    rn_log "  test (newstest2014): $n pairs"
    n=$(dp_same_lines "$DP_OUT/raw/valid.en" "$DP_OUT/raw/valid.$WMT_TGT")
    rn_log "  valid ($WMT_DEV_NAME): $n pairs"
}

_dp_wmt14_tokenize() {
    local x=$DP_WORK/extracted l spec archive prefix suffix split
    local -a inputs
    for l in en "$WMT_TGT"; do
        inputs=()
        for spec in "${WMT_TRAIN[@]}"; do
            IFS='|' read -r archive prefix suffix <<<"$spec"
            inputs+=("$x/$prefix.$l$suffix")
        done
        dp_py moses --lang "$l" --workers "${DP_OPT[workers]}" --max-lines "${DP_OPT[max-train-lines]}" \
            -o "$DP_WORK/train.tok.$l" "${inputs[@]}"
        for split in valid test; do
            dp_py moses --lang "$l" --workers 1 -o "$DP_WORK/$split.tok.$l" "$DP_OUT/raw/$split.$l"
        done
    done
    dp_same_lines "$DP_WORK/train.tok.en" "$DP_WORK/train.tok.$WMT_TGT" >/dev/null
}

_dp_wmt14_learn() { dp_learn_subword "$DP_WORK/train.tok.en" "$DP_WORK/train.tok.$WMT_TGT"; }

_dp_wmt14_apply() {
    local l files=()
    for l in en "$WMT_TGT"; do
        files+=("$DP_WORK/train.tok.$l" "$DP_WORK/train.seg.$l")
        files+=("$DP_WORK/valid.tok.$l" "$DP_OUT/text/valid.$l" "$DP_WORK/test.tok.$l" "$DP_OUT/text/test.$l")
    done
    dp_apply_subword "${files[@]}"
}

_dp_wmt14_clean() {
    dp_py clean --min 1 --max "${DP_OPT[max-len]}" --ratio "${DP_OPT[ratio]}" \
        "$DP_WORK/train.seg.en" "$DP_WORK/train.seg.$WMT_TGT" "$DP_OUT/text/train.en" "$DP_OUT/text/train.$WMT_TGT"
}

_dp_wmt14_binarize() {
    dp_binarize en "$WMT_TGT" "$DP_OUT/text"
    dp_write_info
}
