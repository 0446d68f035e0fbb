#!/usr/bin/env bash
# WMT'14 EN-DE (4.5M pairs) -> Moses tokenization -> joint BPE -> fairseq binarized data.
# The pipeline is dp_wmt14_main in lib.sh (shared with EN-FR). See docs/data-prep.md.
set -euo pipefail

RN_NAME=prepare-wmt14-en-de
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

WMT_TGT=de
WMT_TGT_NAME=German
WMT_DEV_NAME=newstest2013
WMT_DEFAULT_RATIO=1.5 # as fairseq's prepare-wmt14en2de.sh
# The URLs of fairseq's examples/translation/prepare-wmt14en2de.sh --icml17
# (News Commentary v9, the WMT'14 release), plus the WMT'14 dev.tgz for newstest2013.
WMT_FILES=(
    training-parallel-europarl-v7.tgz http://statmt.org/wmt13/training-parallel-europarl-v7.tgz
    training-parallel-commoncrawl.tgz http://statmt.org/wmt13/training-parallel-commoncrawl.tgz
    training-parallel-nc-v9.tgz http://statmt.org/wmt14/training-parallel-nc-v9.tgz
    dev.tgz http://statmt.org/wmt14/dev.tgz
    test-full.tgz http://statmt.org/wmt14/test-full.tgz
)
WMT_TRAIN=(
    "training-parallel-europarl-v7.tgz|training/europarl-v7.de-en|"
    "training-parallel-commoncrawl.tgz|commoncrawl.de-en|"
    "training-parallel-nc-v9.tgz|training/news-commentary-v9.de-en|"
)
WMT_DEV=("dev.tgz|dev/newstest2013")
WMT_TEST="test-full.tgz|test-full/newstest2014-deen-src.en.sgm|test-full/newstest2014-deen-ref.de.sgm"

usage() { dp_wmt14_usage; }
dp_wmt14_main "$@"
