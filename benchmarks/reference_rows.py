#!/usr/bin/env python
"""The shipped rows a verdict compares with (resnmt/study/reference.jsonl, package data):
the study's curves lines of the verdict protocols' settings (resnmt.study.verdict.PROTOCOLS),
each cut to what a comparison reads, from benchmarks/results/curves.jsonl.

    python benchmarks/reference_rows.py            # rewrite resnmt/study/reference.jsonl
    python benchmarks/reference_rows.py --check    # exit 1 where it is not what the results give
"""
import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(1, str(REPO_ROOT))

from resnmt.cli import study_verdict  # noqa: E402
from resnmt.experiment.results import read_jsonl  # noqa: E402
from resnmt.options import Option, add_to_command  # noqa: E402
from resnmt.study.milestones import study_settings  # noqa: E402
from resnmt.study.records import settings_key  # noqa: E402
from resnmt.study.verdict import PROTOCOLS, REFERENCE  # noqa: E402

from campaign.files import RESULTS  # noqa: E402

KEPT = ("benchmark", "row", "seed", "size", "updates", "bleu", "settings_key", "device", "settings")


def protocol_keys() -> dict:
    """{settings key: device} of each verdict protocol's reference lines."""
    a = study_verdict.parser().parse_args(["x", "--workdir", "w", "--out", "o"])
    return {settings_key(study_settings(study_verdict.study_args(a, p))): p.device for p in PROTOCOLS.values()}


def reference_text(lines) -> str:
    """The package's reference lines from the study's ``lines``, in their order."""
    keys = protocol_keys()
    kept = [{k: ({"name": r[k]["name"]} if k == "size" else r[k]) for k in KEPT if k in r} for r in lines
            if r.get("benchmark") == "curves" and keys.get(r.get("settings_key")) == r.get("device", "cpu")]
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in kept)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_to_command(p, [Option("check", False, "compare only; exit 1 where the file differs", kind="switch")])
    a = p.parse_args(argv)
    text = reference_text(read_jsonl(RESULTS / "curves.jsonl"))
    if a.check:
        same = REFERENCE.is_file() and REFERENCE.read_text(encoding="utf-8") == text
        print(f"{REFERENCE}: {'current' if same else 'stale: run python benchmarks/reference_rows.py'}")
        return 0 if same else 1
    REFERENCE.write_text(text, encoding="utf-8")
    print(f"{REFERENCE}: {text.count(chr(10))} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
