#!/usr/bin/env bash
# IWSLT'15 EN-VI (Stanford NMT release, pre-tokenized) -> joint subwords -> fairseq binarized data.
# See docs/data-prep.md.
set -euo pipefail

RN_NAME=prepare-iwslt15-en-vi
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

URL_BASE=https://nlp.stanford.edu/projects/nmt/data/iwslt15.en-vi
# published name prefix -> split name used here (fairseq: train/valid/test)
declare -A SPLIT=([train]=train [tst2012]=valid [tst2013]=test)

usage() {
    cat <<'EOF'
Usage: data-prep/prepare-iwslt15-en-vi.sh [options] [--mirror DIR] OUTDIR

IWSLT'15 English->Vietnamese as released by the Stanford NLP group (train 133K
pairs, tst2012 = valid, tst2013 = test). The release is already tokenized
(Moses-style, with escapes such as &apos; and &quot;): the text is kept exactly
as published, only segmented into joint subwords and binarized with
fairseq-preprocess --joined-dictionary (so --share-all-embeddings works).
Training pairs with an empty side or more than --max-len subwords are dropped;
valid and test are kept whole.

Outputs:
  OUTDIR/bin/                    fairseq data (train/valid/test, en-vi, dict.{en,vi}.txt)
  OUTDIR/bpe/bpe.codes           subword-nmt codes (--bpe subword-nmt), or
  OUTDIR/spm/spm.model           the sentencepiece model (--bpe sentencepiece)
  OUTDIR/raw/test.{en,vi}        tst2013 exactly as published (references), and valid.*
  OUTDIR/text/                   the segmented text given to fairseq-preprocess

Options:
  --bpe METHOD        subword-nmt (joint BPE) or sentencepiece (default: subword-nmt)
  --bpe-size N        BPE merge operations (subword-nmt) or vocabulary size
                      (sentencepiece) (default: 32000, the size of the papers'
                      tensor2tensor vocabulary, translate_envi_iwslt32k)
  --spm-type T        sentencepiece model type: unigram or bpe (default: unigram)
  --max-len N         drop training pairs longer than N subwords (default: 250)
  --max-train-lines N use only the first N training pairs (0: all; smoke tests)
EOF
    dp_common_help
    cat <<EOF

Files ($URL_BASE/):
  train.{en,vi} (not pinned), tst2012.{en,vi}, tst2013.{en,vi} (sha256 pinned)
EOF
}

dp_set_common_defaults
dp_subword_option_defaults
dp_parse_args "$@"
dp_check_subword_options
DP_BPE=${DP_OPT[bpe]}

rn_require_cmds fairseq-preprocess
if [[ $DP_BPE == sentencepiece ]]; then dp_require_python_modules sentencepiece; else dp_require_python_modules subword_nmt; fi
dp_setup bpe bpe-size spm-type max-len max-train-lines

# sha256 of the published test sets (checked against ../shared/data/iwslt15-en-vi,
# a copy of the files as published at the URL above). train.* is not pinned: no
# copy of the published bytes was available to verify a hash against.
dp_pin tst2012.en b8fbcd0d4199d41276421d1f7228298df67dd9e2c5c134c2ee8cdf3ec27801e2
dp_pin tst2012.vi 01004078b3f36b0c46e81b65fc6851230b3c823405c76d1d82ef3b786b512ff0
dp_pin tst2013.en 3860ce60bc5b85d96cc2d3d580cf1bc9d62440e939c1b964676d3607c4e8f1df
dp_pin tst2013.vi 29af16842808da2812b8fd4d47fc05d082ba870e60ab7755090ad04b380994cd

step_fetch() {
    local args=() name l
    for name in train tst2012 tst2013; do
        for l in en vi; do args+=("$name.$l" "$URL_BASE/$name.$l"); done
    done
    dp_fetch_all "${args[@]}"
}

step_copy() {
    local name split l n max=${DP_OPT[max-train-lines]}
    for name in train tst2012 tst2013; do
        split=${SPLIT[$name]}
        n=$(dp_same_lines "$DP_ORIG/$name.en" "$DP_ORIG/$name.vi")
        ((n > 0)) || rn_die "$DP_ORIG/$name.en is empty"
        for l in en vi; do
            if [[ $split == train ]] && ((max > 0)); then
                dp_atomic "$DP_WORK/$split.$l" head -n "$max" "$DP_ORIG/$name.$l"
            else
                dp_atomic "$DP_WORK/$split.$l" cat "$DP_ORIG/$name.$l"
            fi
        done
        rn_log "  $split ($name): $(dp_lines "$DP_WORK/$split.en") pairs"
    done
    dp_keep_raw en vi
}

step_learn() { dp_learn_subword "$DP_WORK/train.en" "$DP_WORK/train.vi"; }

step_apply() {
    dp_apply_subword "$DP_WORK/train.en" "$DP_WORK/train.seg.en" "$DP_WORK/train.vi" "$DP_WORK/train.seg.vi" \
        "$DP_WORK/valid.en" "$DP_OUT/text/valid.en" "$DP_WORK/valid.vi" "$DP_OUT/text/valid.vi" \
        "$DP_WORK/test.en" "$DP_OUT/text/test.en" "$DP_WORK/test.vi" "$DP_OUT/text/test.vi"
}

step_clean() {
    dp_py clean --min 1 --max "${DP_OPT[max-len]}" --ratio 0 \
        "$DP_WORK/train.seg.en" "$DP_WORK/train.seg.vi" "$DP_OUT/text/train.en" "$DP_OUT/text/train.vi"
}

step_binarize() {
    dp_binarize en vi "$DP_OUT/text"
    dp_write_info
}

DP_OUTPUTS[fetch]="orig/train.en orig/train.vi orig/tst2012.en orig/tst2012.vi orig/tst2013.en orig/tst2013.vi"
DP_OUTPUTS[copy]="raw/valid.en raw/valid.vi raw/test.en raw/test.vi"
DP_OUTPUTS[learn]=$(dp_subword_model_rel)
DP_OUTPUTS[apply]="text/valid.en text/valid.vi text/test.en text/test.vi"
DP_OUTPUTS[clean]="text/train.en text/train.vi"
DP_OUTPUTS[binarize]=$(dp_bin_outputs en vi)
DP_READS_WORK="learn apply clean"
dp_run_steps \
    fetch "fetch and verify the 6 published files" step_fetch \
    copy "check line counts, keep raw valid/test text" step_copy \
    learn "learn joint $DP_BPE subwords (size ${DP_OPT[bpe-size]}) on train.en + train.vi" step_learn \
    apply "segment train/valid/test" step_apply \
    clean "drop training pairs with an empty side or > ${DP_OPT[max-len]} subwords" step_clean \
    binarize "fairseq-preprocess --joined-dictionary" step_binarize
