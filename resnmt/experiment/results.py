"""The records of finished runs: JSON-lines files, the names of decoding settings, and
an experiment's record in one line."""
import hashlib
import json
import re
from pathlib import Path
from typing import List

# a name part longer than this is cut and ends in a digest of the whole
MAX_NAME_PART = 60


def append_jsonl(path: Path, record: dict, sort_keys: bool = False) -> None:
    """Append one JSON line with a single write (concurrent writers append whole lines)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False, sort_keys=sort_keys) + "\n")


def read_jsonl(path: Path) -> List[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def flags_name(flags: str) -> str:
    """A file-name part that reads as the flags it names: "--max-len-a 1.2 --max-len-b 10"
    -> "max-len-a1.2_max-len-b10"; one over MAX_NAME_PART characters is cut and ends in
    the first 8 hex digits of the flags' sha1, so distinct flags keep distinct names."""
    words, parts = flags.split(), []
    for word in words:
        if word.startswith("-") and not re.fullmatch(r"-[\d.]+", word):
            parts.append(word.lstrip("-"))
        elif parts:
            parts[-1] += word
        else:
            parts.append(word)
    name = re.sub(r"[^A-Za-z0-9._=+-]+", "-", "_".join(parts)).strip("-")
    if len(name) > MAX_NAME_PART:
        name = name[:MAX_NAME_PART - 9] + "-" + hashlib.sha1(flags.encode()).hexdigest()[:8]
    return name


def decoding_key(checkpoint_label: str, beam: int, lenpen: float, gen_args: str = "") -> str:
    """The name of a model's decoding settings in its output files (gen.test.KEY.out,
    result.KEY.json): e.g. avg10.beam4.lenpen0.6, plus .gen-FLAGS with --gen-args."""
    key = f"{checkpoint_label}.beam{beam}.lenpen{lenpen:g}"
    return f"{key}.gen-{flags_name(gen_args)}" if gen_args.strip() else key


def describe(r: dict) -> str:
    """One line: the scores, the size and the training of an experiment's record."""
    parts = [f"BLEU {r['bleu']:.2f} ({r['signature']})", f"tokenized intl BLEU {r['tok_intl_bleu']:.2f}"]
    if r.get("compound_split_bleu") is not None:
        parts.append(f"compound-split BLEU {r['compound_split_bleu']:.2f}")
    if r.get("params"):
        parts.append(f"{r['params']:,} parameters")
    at = f" (updates {', '.join(map(str, r['averaged_updates']))})" if r.get("averaged_updates") else ""
    parts.append(f"{r['num_updates']} updates, averaged {r['averaged']} {r['averaged_kind']} checkpoints{at}")
    size = f" ({r['size']})" if r.get("size") else ""  # the size trained (records written before: none)
    return f"{r['dataset']} {r['arch']}{size}: " + ", ".join(parts)
