#!/usr/bin/env bash
# Multi30k task 1 EN-DE (raw text) -> joint sentencepiece -> fairseq binarized data.
# See docs/data-prep.md.
set -euo pipefail

RN_NAME=prepare-multi30k
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

URL_BASE=https://github.com/multi30k/dataset/raw/master/data/task1/raw
# name in the release -> split name used here (fairseq: train/valid/test)
declare -A SPLIT=([train]=train [val]=valid [test_2016_flickr]=test)
declare -A EXPECT_LINES=([train]=29000 [valid]=1014 [test]=1000)

usage() {
    cat <<'EOF'
Usage: data-prep/prepare-multi30k.sh [options] [--mirror DIR] OUTDIR

Multi30k task 1, English->German (29,000 train / 1,014 val / 1,000 test2016
pairs, raw untokenized text), segmented with one joint sentencepiece model
trained on train.en + train.de, binarized with fairseq-preprocess
--joined-dictionary (so --share-all-embeddings works).

Outputs:
  OUTDIR/bin/                 fairseq data (train/valid/test, en-de, dict.{en,de}.txt)
  OUTDIR/spm/spm.model        the sentencepiece model (decode hypotheses with it)
  OUTDIR/raw/test.{en,de}     raw test source/reference for sacreBLEU (and valid.*)
  OUTDIR/text/                the segmented text given to fairseq-preprocess

Options:
  --bpe-size N        sentencepiece vocabulary size (default: 8000)
  --spm-type T        sentencepiece model type: unigram or bpe (default: unigram)
EOF
    dp_common_help
    cat <<EOF

Files ($URL_BASE/):
  train.{en,de}.gz val.{en,de}.gz test_2016_flickr.{en,de}.gz  (sha256 pinned)
EOF
}

dp_set_common_defaults
DP_OPT[bpe-size]=8000
DP_OPT[spm-type]=unigram
dp_parse_args "$@"
dp_check_int bpe-size 10
dp_check_choice spm-type unigram bpe
DP_BPE=sentencepiece

rn_require_cmds gzip fairseq-preprocess
dp_require_python_modules sentencepiece
dp_setup bpe-size spm-type

# sha256 of the published files (checked against ../shared/data/multi30k/SHA256SUMS,
# a copy of the files as published at the URL above)
dp_pin train.en.gz d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f
dp_pin train.de.gz 726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6
dp_pin val.en.gz 14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28
dp_pin val.de.gz f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a
dp_pin test_2016_flickr.en.gz 611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9
dp_pin test_2016_flickr.de.gz 9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8

step_fetch() {
    local args=() name l
    for name in train val test_2016_flickr; do
        for l in en de; do args+=("$name.$l.gz" "$URL_BASE/$name.$l.gz"); done
    done
    dp_fetch_all "${args[@]}"
}

step_unpack() {
    local name split l n
    for name in train val test_2016_flickr; do
        split=${SPLIT[$name]}
        for l in en de; do dp_gunzip "$DP_ORIG/$name.$l.gz" "$DP_WORK/$split.$l"; done
        n=$(dp_same_lines "$DP_WORK/$split.en" "$DP_WORK/$split.de")
        [[ $n == "${EXPECT_LINES[$split]}" ]] ||
            rn_die "$name.en.gz has $n lines, the published Multi30k $split split has ${EXPECT_LINES[$split]}"
        rn_log "  $split: $n pairs"
    done
    dp_keep_raw en de
}

step_learn() { dp_learn_subword "$DP_WORK/train.en" "$DP_WORK/train.de"; }

step_apply() {
    local split l files=()
    for split in train valid test; do
        for l in en de; do files+=("$DP_WORK/$split.$l" "$DP_OUT/text/$split.$l"); done
    done
    dp_apply_subword "${files[@]}"
}

step_binarize() {
    dp_binarize en de "$DP_OUT/text"
    dp_write_info
}

DP_OUTPUTS[fetch]=$(for name in train val test_2016_flickr; do printf 'orig/%s.en.gz orig/%s.de.gz ' "$name" "$name"; done)
DP_OUTPUTS[unpack]="raw/valid.en raw/valid.de raw/test.en raw/test.de"
DP_OUTPUTS[learn]=spm/spm.model
DP_OUTPUTS[apply]=$(for split in train valid test; do printf 'text/%s.en text/%s.de ' "$split" "$split"; done)
DP_OUTPUTS[binarize]=$(dp_bin_outputs en de)
DP_READS_WORK="learn apply"
dp_run_steps \
    fetch "fetch and verify the 6 published files" step_fetch \
    unpack "decompress, check line counts, keep raw valid/test text" step_unpack \
    learn "train a joint sentencepiece ${DP_OPT[spm-type]} model (vocabulary ${DP_OPT[bpe-size]})" step_learn \
    apply "segment train/valid/test with sentencepiece" step_apply \
    binarize "fairseq-preprocess --joined-dictionary" step_binarize
