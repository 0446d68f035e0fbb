#!/usr/bin/env python3
"""Average fairseq checkpoints: ``python scripts/average_checkpoints.py --help``.

A thin wrapper around ``resnmt-average`` (resnmt/cli/average_checkpoints.py), for use
from a checkout without installing the package.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from resnmt.cli.average_checkpoints import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
