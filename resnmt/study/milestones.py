"""One run of the curves study trained to each of its milestones in turn, resumably: what is
done (the milestones recorded per run), a lock per run directory (so that several copies of
the study share its plan), the settings every run shares, and at each milestone the newest
checkpoints averaged, test2016 decoded, scored and analysed, one JSON line per milestone.
"""
import argparse
import fcntl
import shutil
import sys
from pathlib import Path

from resnmt.checkpoints.averaging import numbered_checkpoints
from resnmt.data.corpora import MULTI30K, MULTI30K_EN_FR
from resnmt.experiment import steps
from resnmt.experiment.presets import SIZES
from resnmt.experiment.results import append_jsonl, read_jsonl
from resnmt.options import Option, add_to_command
from resnmt.study import flags, runs
from resnmt.study.records import portable_path, run_id
from resnmt.study.rows import slug

# the study's language pairs: "en-de" -> the Multi30k dataset of that pair
PAIRS = {"-".join(d.langs): d for d in (MULTI30K, MULTI30K_EN_FR)}


# The options whose values make a run's settings (its settings key, :func:`study_settings`)
# and how it executes; their defaults are the study's settings.
PAIR = Option("pair", "en-de", kind="choice", choices=tuple(PAIRS), help=(
    "the Multi30k language pair of the prepared corpus (default: %(default)s; "
    + "; ".join(f"{pair}: resnmt-prepare {d.name} data/{d.name}" for pair, d in PAIRS.items()) + ")"))
TRAINING = (
    Option("dropout", 0.3, "default: %(default)s, the usual choice for Multi30k's 29k pairs trained this long",
           kind="number", minimum=0, metavar="P"),
    Option("analyze_sentences", 500, "validation sentences resnmt-analyze runs at each milestone (default: "
           "%(default)s)", kind="int", minimum=1, metavar="N"),
)
DEVICE = Option("device", "cpu", "where every run trains and decodes (default: %(default)s)", kind="choice",
                choices=("cpu", "cuda"))
EXECUTION = (
    Option("sdpa_backends", "", metavar="B,B,...", help=(
        "the attention kernels torch may use (resnmt_translation's flag, e.g. flash,efficient,math: no cuDNN kernel "
        "planning every new batch shape on Hopper); recorded per line, not in the key")),
    Option("fast_path", False, kind="switch", help=(
        "train on resnmt's fast path (resnmt_translation --fast-path: static batch shapes, CUDA graphs); its batches "
        "differ, so it is part of the settings key")),
    Option("bf16", False, kind="switch", help=(
        "train in bf16 (resnmt-train's --bf16: float32 master weights; fairseq 0.12's own --bf16 asks for a TPU); "
        "other arithmetic, so part of the settings key")),
    Option("tiny", False, "train every run at the tiny size (smoke tests)", kind="switch"),
)


def add_run_options(p: argparse.ArgumentParser, device: Option = DEVICE) -> None:
    """The options that make a run (the study's settings by default): the pair, the reference
    it is scored against, the schedule, dropout, checkpoints, the analysis, threads, the
    device (``device``: a command's own wording of it) and how it executes."""
    add_to_command(p, [PAIR])
    flags.add_reference(p)
    flags.add_schedule(p)
    add_to_command(p, TRAINING)
    flags.add_checkpoints(p)
    flags.add_threads(p, 2, note="; not part of the settings key, recorded per line")
    add_to_command(p, [device, *EXECUTION])


def run_parser() -> argparse.ArgumentParser:
    """A parser of the options that make a run, with ``--data``, ``--workdir`` and ``--out``:
    how a command that trains the study's runs its own way (resnmt-study verdict) gets the
    study's settings."""
    p = argparse.ArgumentParser(add_help=False)
    add_to_command(p, [Option("data", metavar="DIR"), Option("workdir", metavar="DIR"), Option("out", metavar="JSONL")])
    add_run_options(p)
    return p


def schedule_of(settings: dict) -> dict:
    """The learning-rate schedule a line was trained under (recorded in each line; its
    numbers are in the settings, so another schedule has another settings key)."""
    return {"lr_scheduler": "inverse_sqrt", "lr": settings["lr"], "warmup_updates": settings["warmup_updates"]}


def execution_flags(a) -> list:
    """fairseq-train flags of how a run executes (recorded per line): the attention kernels,
    which compute the same (out of the settings key); the fast path, whose static batch
    shapes make other batches (in the key: ``"fast_path"``); and bf16 (in the key: ``"dtype"``)."""
    flags = []
    if a.sdpa_backends or a.fast_path:
        flags += ["--task", "resnmt_translation"]
    if a.sdpa_backends:
        flags += ["--sdpa-backends", a.sdpa_backends]
    if a.fast_path:
        flags += ["--fast-path"]
    if a.bf16:  # resnmt-train's bf16 (fairseq 0.12's --bf16 alone asks for a TPU); the CPU's needs --cpu
        flags += ["--bf16", *(["--cpu"] if a.device == "cpu" else [])]
    return flags


def trainer(a) -> list:
    """The training program: fairseq-train, or resnmt-train's module for bf16 (fairseq 0.12's
    --bf16 trains on TPUs only), run by this Python so that a source tree without console
    scripts runs it too."""
    return [sys.executable, "-m", "resnmt.cli.train"] if a.bf16 else ["fairseq-train"]


def done_milestones(lines, key: str, device: str):
    """{(size, row, seed): milestones recorded} for these settings on ``device`` (cpu or cuda)
    in the curves ``lines`` (a file, or several)."""
    done = {}
    for r in (r for path in ([lines] if isinstance(lines, (str, Path)) else lines) for r in read_jsonl(path)):
        if r.get("benchmark") == "curves" and r["settings_key"] == key and r.get("device", "cpu") == device:
            done.setdefault((r["size"]["name"], r["row"], r["seed"]), set()).add(r["updates"])
    return done


class RunLock:
    """An exclusive, non-blocking lock on a run directory (released when the process dies)."""

    def __init__(self, run_dir: Path):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.f = open(run_dir / "lock", "w")

    def acquire(self) -> bool:
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            self.f.close()
            return False

    def release(self) -> None:
        self.f.close()


def run_dir_of(a, key, size, row, seed) -> Path:
    return a.workdir / key / size / f"{slug(row)}.seed{seed}"


def resume_point(ckpt_dir: Path) -> int:
    """The update a run would resume from: its newest update checkpoint (0 if none). This is
    how ``--list`` tells which partial runs still have their checkpoints on this machine."""
    found = numbered_checkpoints(ckpt_dir, "update")
    return max(found[-1][0] if found else 0, runs.trained_updates(ckpt_dir))


def study_settings(a) -> dict:
    """What every run of the study shares (the milestones and the size are per line), from
    the study command's arguments ``a``; its :func:`records.settings_key` names the runs. The
    torch thread count is not a setting: it is recorded per line (``torch_threads``)."""
    return {
        "corpus": PAIRS[a.pair].name, "max_tokens": a.max_tokens, "lr": a.lr, "warmup_updates": a.warmup,
        "dropout": a.dropout, "label_smoothing": 0.1, "save_every": a.save_every, "average": a.average,
        "beam": 4, "lenpen": 0.6, "lenpen_form": "gnmt", "max_len_a": 1, "max_len_b": 50,
        **({"every_size": "tiny"} if a.tiny else {}),
        **({"fast_path": True} if a.fast_path else {}),  # other batches (static shapes): other runs
        **({"dtype": "bf16"} if a.bf16 else {}),  # other arithmetic: other runs (fp32 lines have no key)
    }


def progress(a, text: str) -> None:
    """One progress line on stderr, named for the command (``a.command``: curves, verdict)."""
    print(f"[{a.command}] {text}", file=sys.stderr, flush=True)


def score_milestones(a, settings, key, size, row, seed, milestones_done, env, device):
    """Train run (``size``, ``row``, ``seed``) to each of its milestones not yet done, scoring and
    recording each (a progress line before and after each); its checkpoints go once every
    milestone is done (unless --keep-checkpoints)."""
    run_dir = run_dir_of(a, key, size, row, seed)
    ckpt_dir = run_dir / "checkpoints"
    milestones = a.milestones[size]
    for i, updates in enumerate(milestones, 1):
        if updates in milestones_done:
            continue
        name = f"{size} {row} seed {seed}"
        progress(a, f"{name}: milestone {i}/{len(milestones)}, training to {updates} updates")
        record = score_milestone(a, settings, key, size, row, seed, updates, env, device)
        append_jsonl(a.out, record)
        valid = record["valid"][-1][1] if record["valid"] else float("nan")
        progress(a, f"{name} @ {updates}: sacreBLEU {record['bleu']:.2f}, valid loss {valid:.3f}")
    if not a.keep_checkpoints and all(m in milestones_done or m <= runs.trained_updates(ckpt_dir)
                                      for m in milestones):
        shutil.rmtree(ckpt_dir, ignore_errors=True)


def score_milestone(a, settings, key, size, row, seed, updates, env, device) -> dict:
    """Train the run to ``updates`` (resuming), average its newest checkpoints, decode and
    score test2016, analyse the newest checkpoint: the milestone's JSON line."""
    run_dir = run_dir_of(a, key, size, row, seed)
    ckpt_dir, log = run_dir / "checkpoints", run_dir / "log.txt"
    arch, row_flags = a.rows[row].arch, list(a.rows[row].flags)  # the study's rows, or the verdict's kind
    model_size = SIZES["tiny" if a.tiny else size]
    train_argv = runs.benchmark_train_argv(
        a.bin_dir, arch, row_flags, model_size, seed=seed, max_tokens=a.max_tokens, lr=a.lr, warmup=a.warmup,
        dropout=a.dropout, save_every=a.save_every, keep=a.average, validate=True,
        program=trainer(a)) + execution_flags(a)
    total = runs.train_to(updates, train_argv, ckpt_dir, log, env)  # seconds over the whole run
    ckpts = runs.checkpoints_until(ckpt_dir, a.average, updates)
    avg = run_dir / f"checkpoint.avg{a.average}.upd{updates}.pt"
    result, decode_seconds = runs.average_and_score(
        ckpts, avg, run_dir / f"gen.test.upd{updates}.out", a.bin_dir, a.ref, log, env, remove_bpe=a.remove_bpe,
        max_len_a=1, max_len_b=50)
    avg.unlink()
    analysis = steps.analyze(ckpts[-1], a.bin_dir, run_dir / "analysis" / f"upd{updates}", log, env,
                             num_sentences=a.analyze_sentences)
    fairseq_log = steps.FairseqLog.read(log)
    train_loss = [p for p in fairseq_log.train if p[0] <= updates]
    return {
        "benchmark": "curves", "size": {"name": size, **model_size.as_dict()}, "row": row, "seed": seed,
        "arch": arch, "flags": row_flags, "updates": updates,
        "settings": settings, "settings_key": key,
        "bleu": result["bleu"], "signature": result["signature"], "tok_intl_bleu": result["tok_intl_bleu"],
        "n_sentences": result["n_sentences"],
        "valid": [list(p) for p in fairseq_log.valid if p[0] <= updates],
        "train_loss": train_loss[-1][1] if train_loss else None,
        "params": fairseq_log.params,
        "analysis": {"checkpoint_updates": updates, "split": analysis["split"],
                     "num_sentences": analysis["num_sentences"], "loss": analysis["loss"],
                     "connections": analysis["connections"], "statistics": analysis["statistics"],
                     "streams": analysis["streams"], "norms": analysis["norms"]},
        "averaged": [p.name for p in ckpts],
        "pair": a.pair, "data": portable_path(a.bin_dir, Path(a.data)), "ref": portable_path(a.ref, Path(a.data)),
        "train_seconds": round(total, 1), "decode_seconds": round(decode_seconds, 1),
        "schedule": schedule_of(settings), "execution_flags": execution_flags(a),
        **device, "torch_threads": a.threads,
        "finished": run_id(),
    }


def train_and_score(a, settings, key, run, milestones_done, env, device) -> bool:
    """:func:`score_milestones` of ``run`` (size, row, seed) under its directory's lock;
    False, training nothing, where another copy holds the lock."""
    lock = RunLock(run_dir_of(a, key, *run))
    if not lock.acquire():
        return False
    try:
        score_milestones(a, settings, key, *run, milestones_done, env, device)
    finally:
        lock.release()
    return True


def run_plan(a, settings, key, plan, lines, env, device) -> int:
    """Train and score every run of ``plan`` not done in the curves ``lines``, one at a time,
    skipping those another copy holds; re-reading what is done after each run."""
    while True:
        done = done_milestones(lines, key, a.device)
        todo = [r for r in plan if not set(a.milestones[r[0]]) <= done.get(r, set())]
        if not any(train_and_score(a, settings, key, r, done.get(r, set()), env, device) for r in todo):
            return 0  # every remaining run is done or locked by another copy
