#!/usr/bin/env python
"""The curves study: ``resnmt-study curves`` (resnmt/cli/study_curves.py), the same command
line, kept here for the GPU job (benchmarks/gpu_study.sh), where resnmt runs from its
source tree without console scripts.

    python benchmarks/curves.py --list
    python benchmarks/curves.py --pair en-fr --workers 2 --threads 1
"""
import sys

from resnmt.cli.study import main

if __name__ == "__main__":
    sys.exit(main(["curves", *sys.argv[1:]]))
