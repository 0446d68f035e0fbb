"""``Experiment``: prepare -> train -> average -> decode -> score for one model, each step
skipped when its output exists and is newer than its inputs (re-running resumes an
interrupted experiment or does nothing; prepared data whose inputs changed since is
prepared again, or refused for a corpus of one's own; a finished training whose data or
flags changed since is refused). ``resnmt-experiment`` (``resnmt.cli.experiment``) and the
demo (``resnmt.cli.demo``) run it."""
import json
import os
import shlex
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional, Tuple

from resnmt.atomic import atomic_write_text
from resnmt.data.corpora import DATASETS
from resnmt.data.manifest import ManifestError, read_manifest
from resnmt.decoding.subword import SubwordError, checked_post_process
from resnmt.experiment import steps
from resnmt.experiment.command_options import convert_options, option
from resnmt.experiment.errors import ExperimentError, Log, UsageError
from resnmt.experiment.presets import (TrainPlan, TrainRequest, dataset_of, default_data_root, plan_training,
                                      prepared_dataset, trained_size)
from resnmt.experiment.results import append_jsonl, decoding_key, describe
from resnmt.experiment.runtime import require_commands, tool_env
from resnmt.progress import format_seconds

# resnmt-experiment's own options, beside the training options it shares (presets.SHARED_TRAIN_OPTIONS)
EXPERIMENT_OPTIONS = ("data_root", "mirror", "prep_args", "average", "exclude_last", "beam", "lenpen",
                      "batch_size", "gen_args", "strict", "verbose", "results")


@dataclass
class ExperimentRequest:
    """One experiment (resnmt-experiment's options); checked and converted (numbers,
    paths) on construction, like ``TrainRequest``."""

    train: TrainRequest
    data_root: Optional[Path] = option(
        None, "DIR", "the prepared dataset (default: data/DATASET, or DATASET itself when it is a directory)",
        kind="path")
    mirror: Optional[Path] = option(
        None, "DIR", "a local copy of the published files for resnmt-prepare (machines without internet); "
        "without it they are downloaded", kind="path")
    prep_args: str = option("", '"A B"', 'more options for resnmt-prepare (e.g. "--bpe-size 8000")')
    average: int = option(10, "N", "checkpoints to average (fewer if fewer exist, with a note)", kind="int",
                          minimum=1)
    exclude_last: bool = option(
        False, "", "average numbered checkpoints only (without it, checkpoint_last.pt counts as the newest where "
        "training stopped mid-epoch: the model scored is the one trained)", kind="switch")
    beam: int = option(4, "K", "beam size", kind="int", minimum=1)
    lenpen: float = option(0.6, "A", "GNMT length penalty alpha", kind="number")
    batch_size: int = option(128, "N", "decoding batch size in sentences", kind="int", minimum=1)
    gen_args: str = option("", '"A B"', 'more fairseq-generate flags (e.g. "--max-len-b 50")')
    strict: bool = option(False, "", "exit status 1 when the score is flagged as meaningless (the warning "
                          "after it), for scripts", kind="switch")
    verbose: bool = option(False, "", "print fairseq's configuration and model dumps too (train.log keeps "
                           "them either way)", kind="switch")
    results: Path = option(Path("runs/results.jsonl"), "FILE", "JSON lines file of all runs", kind="path")
    # torch threads of its training and decoding (None: torch's default; the demo sets it)
    threads: Optional[int] = option(None, "N", "torch threads", kind="int", minimum=1)

    def __post_init__(self):
        convert_options(self)
        if self.data_root is not None:  # OUTDIR/bin names OUTDIR, as DATASET does
            self.data_root = Path(prepared_dataset(str(self.data_root)))
        if self.mirror is not None and not self.mirror.is_dir():
            raise UsageError(f"--mirror {self.mirror}: no such directory")


class Experiment:
    """``run``: prepare -> train -> average -> decode -> score for one model, each step
    skipped when its output exists. All options are checked on construction."""

    STEPS = 5

    def __init__(self, req: ExperimentRequest, log: Log, train_log: Log, label: str = ""):
        """``label`` starts each line of fairseq's output (to tell concurrent experiments apart)."""
        self.req, self.log, self.train_log, self.label = req, log, train_log, label
        self.dataset = dataset_of(req.train.dataset)
        self.builtin = req.train.dataset in DATASETS  # else a directory prepared by resnmt-prepare
        require_commands("fairseq-generate")
        self.data_root = req.data_root or default_data_root(req.train.dataset)
        try:  # every option of the training step is checked now, before any heavy work
            plan = plan_training(replace(req.train, data=self.data_root / "bin"), dry_run=True)
        except ExperimentError as e:  # one line, the last, exit status 1 as for a failed step
            raise ExperimentError(f"the training options were refused: {e}") from None
        self.size = trained_size(req.train.arch, plan.cmd)
        self.save_dir = plan.save_dir  # --save-dir, else runs/DATASET/ARCH[-SIZE][-TAG]
        self.train_request = replace(req.train, data=self.data_root / "bin", save_dir=self.save_dir)

    def plan(self) -> List[str]:
        """What ``run`` would do, one line per step; nothing is run or written."""
        prepared = steps.is_prepared(self.data_root, self.dataset.tgt)
        mirror = ["--mirror", str(self.req.mirror)] if self.req.mirror else []
        prepare = shlex.join(["resnmt-prepare", self.dataset.name, *mirror, *shlex.split(self.req.prep_args),
                              str(self.data_root)])
        post = self.post_process() if prepared else "(read from the prepared data)"
        scoring = "".join(f" --{k.replace('_', '-')}" + ("" if v is True else f" {v}")
                          for k, v in self.dataset.score_options.items() if v)
        train = plan_training(self.train_request, dry_run=True)
        return [
            f"1. prepare  {f'{self.data_root} is prepared' if prepared else prepare}",
            f"2. train    {shlex.join(train.cmd)}",
            f"3. average  the last {self.req.average} update (else epoch) checkpoints in {self.save_dir}"
            + (", checkpoint_last.pt the newest where training stopped mid-epoch" if not self.req.exclude_last
               else ""),
            f"4. decode   fairseq-generate {self.data_root / 'bin'} --gen-subset test --beam {self.req.beam} "
            f"--lenpen-form gnmt --lenpen {self.req.lenpen:g} --post-process {post} {self.req.gen_args}".rstrip(),
            f"5. score    resnmt-evaluate --ref {self.data_root / 'raw' / f'test.{self.dataset.tgt}'}{scoring}, "
            f"appended to {self.req.results}",
            *(f"note: {note}" for note in train.notes),
            *(f"warning: {w}" for w in self.schedule_warnings(train)),
        ]

    def schedule_warnings(self, plan: Optional[TrainPlan] = None) -> List[str]:
        """What in the training schedule (of ``plan``, else planned now) cannot give the model
        it promises, one line each (``resnmt.experiment.schedule``), with the checkpoints this
        experiment averages."""
        plan = plan or plan_training(self.train_request, dry_run=True)
        return plan.schedule.warnings(self.req.average, not self.req.exclude_last)

    def step(self, number: int, message: str) -> None:
        self.log(f"step {number}/{self.STEPS}: {message}")

    def run(self) -> Optional[dict]:
        """The experiment's record (also in SAVE_DIR/result.json); None on a node other than
        torchrun's node 0 (--node-rank R > 0), whose ranks train and stop: node 0 averages,
        decodes and scores."""
        self.prepare()
        self.post_process()  # a --post-process in --gen-args that cannot undo the data's subwords: refused before training
        self.train()
        if self.req.train.node_rank:
            self.log(f"node {self.req.train.node_rank}: its ranks trained; node 0 averages, decodes and scores")
            return None
        checkpoint, updates, kind, label = self.average()
        key = decoding_key(label, self.req.beam, self.req.lenpen, self.req.gen_args)
        gen = self.decode(checkpoint, key)
        return self.score(gen, key, checkpoint, updates, kind)

    def prepare(self) -> None:
        """The prepared data, prepared (again, when an input of a built-in dataset changed since)."""
        prepared = steps.is_prepared(self.data_root, self.dataset.tgt)
        changed = steps.changed_inputs(self.data_root, self.req.mirror if self.builtin else None, self.log) \
            if prepared else []
        # --prep-args on prepared data: resnmt-prepare compares them with those it recorded
        checked = prepared and not changed and self.builtin and bool(self.req.prep_args.strip())
        if prepared and not changed and not checked:
            self.step(1, f"prepare: {self.data_root}/bin exists, skipped")
            return
        if not self.builtin and changed:  # its data was made from the old text, which only its own command reads
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            raise ExperimentError(f"{changed[0]}{more}: prepare {self.data_root} again with the resnmt-prepare "
                                  "custom command that prepared it")
        if not self.builtin:
            raise ExperimentError(f"{self.data_root} holds no prepared data (bin/dict.{self.dataset.tgt}.txt, "
                                  f"raw/test.{self.dataset.tgt}, from a resnmt-prepare run that finished): prepare it "
                                  f"with resnmt-prepare custom ... {self.data_root}")
        # resnmt-prepare names the input that changed, in one line, and redoes what depends on it
        self.step(1, f"prepare: {self.data_root}/bin exists; resnmt-prepare checks it against --prep-args" if checked
                  else f"prepare {self.data_root}" + (" again: an input changed since it was prepared" if changed
                                                      else ""))
        require_commands("resnmt-prepare")
        steps.prepare(self.dataset.name, self.data_root, self.req.mirror, shlex.split(self.req.prep_args))

    def train(self) -> None:
        done = self.save_dir / "train.done"
        if done.exists():
            self.check_trained(done)
            self.step(2, f"train: {done} exists, skipped")
            return
        self.step(2, f"train {self.req.train.arch} ({self.size}) into {self.save_dir}")
        t0 = time.time()
        plan = plan_training(self.train_request, self.train_log)
        for warning in self.schedule_warnings(plan):
            self.train_log(f"warning: {warning}")
        steps.train(plan, self.train_log, self.req.threads, self.label, verbose=self.req.verbose)
        bin_dir = self.data_root / "bin"
        atomic_write_text(done, json.dumps({"wall_seconds": int(time.time() - t0), "cmd": [str(c) for c in plan.cmd],
                                            "data_dir": str(bin_dir), "data": steps.data_stamp(bin_dir)}) + "\n")

    def check_trained(self, done: Path) -> None:
        """A finished training whose data or command changed since (train.done records both) is
        refused in one line naming what changed: its checkpoints are not the model asked for.
        Data files written again with the same bytes (sha256) are recorded anew, in one line."""
        record = json.loads(done.read_text())
        redo = f"use another --save-dir (or --tag), or delete {self.save_dir} to train again"
        bin_dir = self.data_root / "bin"
        if "data" in record:
            changed, now = steps.data_changes(record["data"], bin_dir)
            names = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            trained_on = record.get("data_dir", str(bin_dir))
            if changed and trained_on != str(bin_dir):
                raise ExperimentError(f"{self.save_dir} was trained on {trained_on}, not on {bin_dir} ({names} "
                                      f"differ): {redo}")
            if changed:
                raise ExperimentError(f"{self.save_dir} was trained on {bin_dir} before {names} changed (the corpus "
                                      f"was prepared again): {redo}")
            touched = [name for name in now if now[name] != record["data"].get(name)]
            if touched:
                self.log(f"{bin_dir}: {', '.join(touched[:3])}{' ...' if len(touched) > 3 else ''} written again "
                         f"with the same bytes since {self.save_dir} was trained: its training stands")
                atomic_write_text(done, json.dumps({**record, "data_dir": str(bin_dir), "data": now}) + "\n")
        if "cmd" in record:
            cmd = [str(c) for c in plan_training(self.train_request, dry_run=True).cmd]
            before, now = steps.flag_changes(record["cmd"], cmd)
            if before or now:
                raise ExperimentError(f"{self.save_dir} was trained with other flags ({before or 'none'} then, "
                                      f"{now or 'none'} now): {redo}; or delete {done} to resume it with these")

    def average(self) -> Tuple[Path, List[int], str, str]:
        """(checkpoint to decode, the updates of the checkpoints averaged, their kind, label):
        the newest ``--average`` update checkpoints or, without any, epoch checkpoints, and
        checkpoint_last.pt after them where training stopped later (unless ``--exclude-last``);
        fewer if fewer exist; checkpoint_last.pt alone if training saved no numbered one."""
        from resnmt.checkpoints.averaging import LAST, AverageError, numbered_checkpoints, select_checkpoints

        by = "update" if numbered_checkpoints(self.save_dir, "update") else "epoch"
        # checkpoint_last.pt: the newest where training stopped mid-epoch; alone where it saved no numbered one
        include_last = not self.req.exclude_last or not numbered_checkpoints(self.save_dir, by)
        try:
            selection = select_checkpoints(self.save_dir, self.req.average, by, include_last=include_last)
        except AverageError as e:
            raise ExperimentError(f"no checkpoints to average in {self.save_dir}: {e}") from None
        selected, updates = selection.paths, selection.updates
        if selection.available == 1 and selection.with_last:
            # training stopped (--max-update) before the end of epoch 1 and saved no numbered checkpoint
            self.step(3, f"average: no epoch or update checkpoints in {self.save_dir}, decoding {LAST} alone "
                         f"(update {updates[0]})")
            return selected[0], updates, "last", "last"
        n, kind = len(selected), selection.kind
        label = f"avg{n}-last" if selection.with_last else f"avg{n}"
        output = self.save_dir / f"checkpoint.{label}.pt"
        if steps.up_to_date(output, selected, self.log):
            self.step(3, f"average: {output} exists, skipped")
        else:
            self.step(3, f"average the last {n} {kind} checkpoints (updates {', '.join(map(str, updates))}) "
                         f"-> {output}")
            for note in selection.notes("--average"):
                self.log(f"note: {note}")
            steps.average(selected, output)
        return output, updates, kind, label

    def post_process(self) -> str:
        """fairseq-generate's --post-process for the data's subword model (its manifest); another
        one in --gen-args (it would come last and win) is refused."""
        try:
            subword = read_manifest(self.data_root).subword
        except ManifestError as e:
            raise ExperimentError(f"cannot tell how {self.data_root} was segmented: {e}") from None
        try:
            return checked_post_process(subword, shlex.split(self.req.gen_args), self.data_root)
        except SubwordError as e:
            raise ExperimentError(f"--gen-args: {e}") from None

    def decode(self, checkpoint: Path, key: str) -> Path:
        gen = self.save_dir / f"gen.test.{key}.out"
        if steps.up_to_date(gen, [checkpoint], self.log):
            self.step(4, f"decode: {gen} exists, skipped")
            return gen
        self.step(4, f"decode test with beam {self.req.beam}, GNMT length penalty {self.req.lenpen:g} -> {gen}")
        t0 = time.time()
        steps.decode(self.data_root / "bin", checkpoint, gen, None, tool_env(self.req.threads), beam=self.req.beam,
                     lenpen=self.req.lenpen, batch_size=self.req.batch_size,
                     extra=["--source-lang", self.dataset.src, "--target-lang", self.dataset.tgt,
                            "--post-process", self.post_process(), *shlex.split(self.req.gen_args)],
                     verbose=self.req.verbose)
        sentences = sum(line.startswith("D-") for line in gen.read_text(encoding="utf-8").splitlines())
        self.log(f"decoded {sentences} sentences in {format_seconds(time.time() - t0)}")
        return gen

    def score(self, gen: Path, key: str, checkpoint: Path, updates: List[int], kind: str) -> dict:
        result_path = self.save_dir / f"result.{key}.json"
        if steps.up_to_date(result_path, [gen], self.log):
            self.step(5, f"score: {result_path} exists, skipped")
            record = json.loads(result_path.read_text(encoding="utf-8"))
        else:
            ref = self.data_root / "raw" / f"test.{self.dataset.tgt}"
            self.step(5, f"score against {ref}")
            from resnmt.decoding.scoring import summary

            result = steps.score(gen, ref, **self.dataset.score_options)
            print(summary(result), flush=True)
            score_warnings = result.pop("warnings")
            fairseq_log = steps.FairseqLog.read(self.save_dir / "train.log")
            last_epoch = fairseq_log.epochs[-1] if fairseq_log.epochs else (None, None, None)
            record = {
                "dataset": self.dataset.name, "arch": self.req.train.arch, "size": self.size,
                "save_dir": os.path.abspath(self.save_dir),
                "params": fairseq_log.params, "num_updates": last_epoch[1], "epochs": last_epoch[0],
                "train_seconds": fairseq_log.train_seconds,
                "train_wall_seconds": json.loads((self.save_dir / "train.done").read_text()).get("wall_seconds"),
                "checkpoint": os.path.abspath(checkpoint), "averaged": len(updates), "averaged_kind": kind,
                "averaged_updates": updates,
                "beam": self.req.beam, "lenpen": self.req.lenpen, "lenpen_form": "gnmt",
                **dict(sorted(result.items())),
                # what cannot give the model promised, then what makes the score meaningless
                "warnings": self.schedule_warnings() + score_warnings, "score_meaningless": bool(score_warnings),
            }
            atomic_write_text(result_path, json.dumps(record) + "\n")
            append_jsonl(self.req.results, record)
            self.log(f"appended the result to {self.req.results}")
        # result.json: the result of the latest settings (rewritten only when they changed)
        latest = self.save_dir / "result.json"
        text = result_path.read_text(encoding="utf-8")
        if not latest.exists() or latest.read_text(encoding="utf-8") != text:
            atomic_write_text(latest, text)
        print(describe(record), flush=True)
        return record
