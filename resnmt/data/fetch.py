"""The fetch step of data preparation: a dataset's published files in OUTDIR/orig, each
verified against its pinned sha256.

A file comes from the user (``resnmt-prepare custom``: linked where it is), from a local
mirror (``--mirror DIR``: linked), from an earlier run's download (verified again), or is
downloaded (from its published URL or ``--mirror-url``), resuming a partial download, and
renamed into place only once verified. The hashes are those pinned in the dataset's table
(``resnmt.data.corpora``), overridden by ``--checksums FILE``; orig/SHA256SUMS records the
hashes of the files used, and OUTDIR/.stamps/inputs the file each was read from with its
size and modification time, so that a later run sees an input that changed since
(``Fetch.changed``). The runner (``resnmt.data.pipeline``) calls ``Fetch.run`` as step 1.
"""
import hashlib
import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from tqdm import tqdm

from resnmt.atomic import atomic_write_text
from resnmt.data.textproc import DataPrepError

# each input's source, size, mtime and sha256 as the fetch step last verified it, in OUTDIR
RECORD = ".stamps/inputs"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise DataPrepError(f"cannot read {path}: {e.strerror}") from None
    return digest.hexdigest()


class Fetch:
    """orig/NAME for every file of ``ds``, from the sources ``args`` names (``mirror``,
    ``mirror_url``, ``checksums``), checked against the known hashes."""

    def __init__(self, ds, args, orig: Path, log: Callable[[str], None]):
        """``orig``: OUTDIR/orig; OUTDIR/RECORD records each input as used (its source, size, mtime, sha256)."""
        self.ds, self.args, self.orig, self.log = ds, args, orig, log
        self.record = orig.parent / RECORD
        # NAME -> (sha256, where that hash comes from)
        self.sha256: Dict[str, Tuple[str, str]] = {
            f.name: (f.sha256, f"pinned in resnmt's table of {ds.name}, resnmt.data.corpora")
            for f in ds.files if f.sha256}

    def read_checksums(self) -> None:
        """``--checksums FILE`` over the pinned hashes (checked before any step runs)."""
        if not self.args.checksums:
            return
        n = 0
        for line in Path(self.args.checksums).read_text().splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            digest, _, name = line.strip().partition(" ")
            if not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
                raise DataPrepError(f"--checksums {self.args.checksums}: '{digest}' is not a sha256 "
                                    "(expected lines 'HASH  NAME')")
            self.sha256[name.strip().lstrip("*")] = (digest.lower(), f"--checksums {self.args.checksums}")
            n += 1
        if n == 0:
            raise DataPrepError(f"--checksums {self.args.checksums}: no 'HASH  NAME' line")

    def description(self) -> str:
        files = self.ds.files
        return (f"link the {len(files)} files of your corpus" if all(f.local for f in files)
                else f"fetch and verify the {len(files)} published files")

    def verify(self, path: Path, name: str) -> str:
        """The sha256 of path; an error when it differs from the known hash of NAME."""
        actual = sha256_of(path)
        if name in self.sha256:
            expected, source = self.sha256[name]
            if actual != expected:
                raise DataPrepError(f"checksum mismatch for {name} ({path}): sha256 is {actual}, "
                                    f"expected {expected} ({source})")
            self.log(f"  {name}: sha256 OK")
        else:
            self.log(f"  {name}: sha256 {actual} (not pinned: no published hash is known; pass --checksums to pin it)")
        return actual

    def run(self) -> None:
        """orig/NAME for every published file: a symlink into --mirror, or a download that
        is renamed into place only once verified; orig/SHA256SUMS records what was used."""
        sums = []
        for f in self.ds.files:
            dest = self.orig / f.name
            if f.local:  # resnmt-prepare custom: the user's file, checked before any work
                sums.append((sha256_of(Path(f.local)), f.name))
                dest.unlink(missing_ok=True)
                dest.symlink_to(f.local)
                self.log(f"  {f.name}: {f.local}")
            elif self.args.mirror:
                src = Path(self.args.mirror) / f.name
                if not src.exists():
                    raise DataPrepError(f"{f.name} not found in mirror {self.args.mirror} (a mirror holds the "
                                        f"published files under their published names; expected {src})")
                sums.append((self.verify(src, f.name), f.name))
                dest.unlink(missing_ok=True)
                dest.symlink_to(src)
            elif dest.is_file() and not dest.is_symlink():
                self.log(f"  {f.name}: already downloaded")
                try:
                    sums.append((self.verify(dest, f.name), f.name))
                except DataPrepError as e:
                    raise DataPrepError(f"{e} (delete it to download it again)") from None
            else:
                dest.unlink(missing_ok=True)
                url = f"{self.args.mirror_url.rstrip('/')}/{f.name}" if self.args.mirror_url else f.url
                part = dest.with_name(dest.name + ".part")
                self.download(url, part)
                try:
                    sums.append((self.verify(part, f.name), f.name))
                except DataPrepError as e:
                    part.replace(part.with_name(part.name + ".bad"))
                    raise DataPrepError(f"{e}; the download is kept as {part}.bad") from None
                part.replace(dest)
        self.write_record(dict((n, h) for h, n in sums))

    def download(self, url: str, part: Path, tries: int = 3) -> None:
        """Download url to part, resuming a partial download when the server allows it."""
        self.log(f"  {part.name[:-5]}: downloading {url}")
        for attempt in range(1, tries + 1):
            have = part.stat().st_size if part.exists() else 0
            request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    resumed = have and r.status == 206
                    total = int(r.headers.get("Content-Length", 0)) + (have if resumed else 0)
                    with open(part, "ab" if resumed else "wb") as f, \
                            tqdm(total=total or None, initial=have if resumed else 0, unit="B", unit_scale=True,
                                 desc=part.name[:-5], mininterval=10) as bar:
                        for block in iter(lambda: r.read(1 << 20), b""):
                            f.write(block)
                            bar.update(len(block))
                return
            except urllib.error.HTTPError as e:
                if e.code == 416 and have:  # nothing left to fetch: the partial file is complete
                    return
                raise DataPrepError(f"download of {url} failed ({e}); "
                                    "re-run to retry, or fetch the files yourself and pass --mirror DIR") from None
            except (urllib.error.URLError, OSError) as e:
                if attempt == tries:
                    raise DataPrepError(f"download of {url} failed ({e}); partial data kept in {part}, "
                                        "re-run to resume") from None
                self.log(f"  download of {url} failed ({e}), retrying in 5 s")
                time.sleep(5)

    # ------------------------------------------------------------ inputs changed since

    def source(self, f) -> Path:
        """Where this run reads the file ``f`` from: the user's file, the mirror's, or the download."""
        if f.local:
            return Path(f.local)
        return Path(self.args.mirror) / f.name if self.args.mirror else self.orig / f.name

    def write_record(self, sha256: Dict[str, str]) -> None:
        """orig/SHA256SUMS and the record of each input's source, size and mtime (once they are verified)."""
        record = {}
        for f in self.ds.files:
            st = self.source(f).stat()
            record[f.name] = {"source": str(self.source(f).absolute()), "size": st.st_size,
                              "mtime_ns": st.st_mtime_ns, "sha256": sha256[f.name]}
        atomic_write_text(self.orig / "SHA256SUMS", "".join(f"{sha256[f.name]}  {f.name}\n" for f in self.ds.files))
        atomic_write_text(self.record, json.dumps(record, indent=1) + "\n")

    def changed(self) -> List[str]:
        """One line per input of this run whose bytes differ from those the last fetch
        recorded (``input_changes``)."""
        return input_changes(self.orig.parent, {f.name: self.source(f) for f in self.ds.files}, self.log)


def compare_bytes(path: Path, st, size, mtime_ns, sha256) -> str:
    """How ``path`` (stat ``st``) stands against a record of its bytes: "same" when its size and
    mtime are the recorded ones (nothing read), "touched" when only they differ and its sha256 is
    the recorded one, else "changed" (a file of another size, or with no sha256 recorded, is
    not read)."""
    if (st.st_size, st.st_mtime_ns) == (size, mtime_ns):
        return "same"
    if sha256 is None or (size is not None and st.st_size != size):
        return "changed"
    return "touched" if sha256_of(path) == sha256 else "changed"


def read_record(outdir: Path) -> Dict[str, dict]:
    """OUTDIR's record of its inputs (NAME -> source, size, mtime_ns, sha256) as the last fetch
    step wrote it; {} when it recorded none."""
    try:
        return json.loads((Path(outdir) / RECORD).read_text())
    except (OSError, ValueError):  # prepared before inputs were recorded: orig/SHA256SUMS has their sha256
        sums = Path(outdir) / "orig" / "SHA256SUMS"
        lines = sums.read_text().splitlines() if sums.is_file() else []
        return {name: {"sha256": digest} for digest, _, name in (line.partition("  ") for line in lines)}


def input_changes(outdir: Path, sources: Dict[str, Path], log: Callable[[str], None],
                  record_anew: bool = True) -> List[str]:
    """One line per input (NAME -> the file read for it now) whose bytes differ from those
    OUTDIR's last fetch recorded: its sha256 is computed only where the size or mtime differ,
    so nothing is read when nothing changed. Inputs with only a new mtime (the same bytes)
    are, when no input changed, recorded anew (unless not ``record_anew``: a reader that
    cannot write OUTDIR) with a line saying so."""
    record, lines, touched = read_record(outdir), [], {}
    for name, path in sources.items():
        was = record.get(name)
        try:
            st = path.stat()
        except OSError as e:
            lines.append(f"input {path} ({name}) cannot be read any more: {e.strerror}")
            continue
        if was is None:
            lines.append(f"input {path} ({name}) is not among the inputs the last run recorded")
        else:
            how = compare_bytes(path, st, was.get("size"), was.get("mtime_ns"), was["sha256"])
            if how == "changed":
                size = f"size {was['size']} -> {st.st_size}, " if was.get("size", st.st_size) != st.st_size else ""
                lines.append(f"input {path} ({name}) changed since it was prepared ({size}other sha256)")
            elif how == "touched":
                touched[name] = path
    if touched and not lines and record_anew:
        for name, path in touched.items():
            if "mtime_ns" in record[name]:  # (a record read from orig/SHA256SUMS is completed silently)
                log(f"input {path} ({name}): modified time changed, same bytes (sha256): nothing to redo")
            st = path.stat()
            record[name] = {"source": str(path.absolute()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                            "sha256": record[name]["sha256"]}
        atomic_write_text(Path(outdir) / RECORD, json.dumps(record, indent=1) + "\n")
    return lines
