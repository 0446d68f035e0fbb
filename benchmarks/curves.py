#!/usr/bin/env python
"""The curves study, the project's own campaign: its runs in priority order per language
pair and size, trained and scored at each milestone by resnmt's study protocol
(resnmt.study), resumably; see campaign/curves.py for the whole command line.

    python benchmarks/curves.py --list
    python benchmarks/curves.py --pair en-fr --workers 2 --threads 1
"""
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # resnmt, where it is not installed (the GPU machine)
    sys.path.insert(1, str(REPO_ROOT))

from campaign.curves import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
