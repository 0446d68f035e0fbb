#!/usr/bin/env bash
# WMT'14 EN-FR (36M pairs) -> Moses tokenization -> joint BPE -> fairseq binarized data.
# The pipeline is dp_wmt14_main in lib.sh (shared with EN-DE). See docs/data-prep.md.
set -euo pipefail

RN_NAME=prepare-wmt14-en-fr
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

WMT_TGT=fr
WMT_TGT_NAME=French
WMT_DEV_NAME=newstest2012+newstest2013
WMT_DEFAULT_RATIO=1.5 # as fairseq's prepare-wmt14en2fr.sh
# The URLs of fairseq's examples/translation/prepare-wmt14en2fr.sh, plus the
# WMT'14 dev.tgz for newstest2012 and newstest2013.
WMT_FILES=(
    training-parallel-europarl-v7.tgz http://statmt.org/wmt13/training-parallel-europarl-v7.tgz
    training-parallel-commoncrawl.tgz http://statmt.org/wmt13/training-parallel-commoncrawl.tgz
    training-parallel-un.tgz http://statmt.org/wmt13/training-parallel-un.tgz
    training-parallel-nc-v9.tgz http://statmt.org/wmt14/training-parallel-nc-v9.tgz
    training-giga-fren.tar http://statmt.org/wmt10/training-giga-fren.tar
    dev.tgz http://statmt.org/wmt14/dev.tgz
    test-full.tgz http://statmt.org/wmt14/test-full.tgz
)
WMT_TRAIN=(
    "training-parallel-europarl-v7.tgz|training/europarl-v7.fr-en|"
    "training-parallel-commoncrawl.tgz|commoncrawl.fr-en|"
    "training-parallel-un.tgz|un/undoc.2000.fr-en|"
    "training-parallel-nc-v9.tgz|training/news-commentary-v9.fr-en|"
    "training-giga-fren.tar|giga-fren.release2.fixed|.gz"
)
WMT_DEV=("dev.tgz|dev/newstest2012" "dev.tgz|dev/newstest2013")
WMT_TEST="test-full.tgz|test-full/newstest2014-fren-src.en.sgm|test-full/newstest2014-fren-ref.fr.sgm"

usage() { dp_wmt14_usage; }
dp_wmt14_main "$@"
