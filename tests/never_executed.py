"""The functions of resnmt/ that the default suite never executes, from a coverage run
(``make coverage``: the suite under coverage, every subprocess it starts included, then this).

Each function of resnmt/ is executed by the default suite or is listed in ELSEWHERE with the
place it runs: a slow test (``make test-slow``), a GPU test, a process coverage cannot follow
(an installed copy, a submitit job, a program loaded without resnmt), code that
``torch.compile`` traces instead of running, or an abstract method. The report names every
function that is in neither (it should be tested or deleted) and every entry of ELSEWHERE that
the suite now executes (the entry should go); either makes it exit 1.

    python tests/never_executed.py coverage.json
"""
import json
import sys
from typing import Dict, List, Tuple

INSTALLED_VERDICT = "tests/test_install.py::test_an_installed_kind_package_and_its_verdict_from_an_empty_folder " \
    "(the verdict's run, in an installed copy and a submitit job)"
EXPORT_RUNNER = "tests/test_export.py::test_torch_export_decodes_as_fairseq_generate_where_resnmt_cannot_be_imported " \
    "(a copy of the runner, loaded without resnmt)"
COMPILED = "traced by torch.compile, not run line by line: tests/test_fused.py"
CUDA = "on a GPU only: the CUDA tests of tests/test_fast_path.py"
ELSEWHERE: Dict[str, str] = {
    "resnmt/activations/normalized.py:batch_statistics": COMPILED,
    "resnmt/activations/normalized.py:scaled_activation": COMPILED,
    "resnmt/connections/gated.py:sas_output": COMPILED,
    "resnmt/connections/hyper.py:StreamMixer.width": "abstract: each mixer's own width runs",
    "resnmt/cli/demo.py:demo_main": "the demo: tests/test_demo.py (slow)",
    "resnmt/cli/demo.py:demo": "the demo: tests/test_demo.py (slow)",
    "resnmt/cli/demo.py:analyze_demo_models": "the demo: tests/test_demo.py (slow)",
    "resnmt/cli/experiment.py:demo_main": "the demo: tests/test_demo.py (slow)",
    "resnmt/experiment/steps.py:analyze": "the demo (slow) and " + INSTALLED_VERDICT,
    "resnmt/cli/study_verdict.py:train": INSTALLED_VERDICT,
    "resnmt/cli/study_verdict.py:say_cost": INSTALLED_VERDICT,
    "resnmt/study/cost.py:measured_rate": INSTALLED_VERDICT,
    "resnmt/study/cost.py:move": INSTALLED_VERDICT,
    "resnmt/study/jobs.py:with_absolute_paths": INSTALLED_VERDICT,
    "resnmt/study/jobs.py:RunJob.__call__": INSTALLED_VERDICT,
    "resnmt/study/milestones.py:RunLock.__init__": INSTALLED_VERDICT,
    "resnmt/study/milestones.py:RunLock.acquire": INSTALLED_VERDICT,
    "resnmt/study/milestones.py:RunLock.release": INSTALLED_VERDICT,
    "resnmt/study/milestones.py:progress": INSTALLED_VERDICT,
    "resnmt/study/milestones.py:score_milestones": INSTALLED_VERDICT,
    "resnmt/study/milestones.py:score_milestone": INSTALLED_VERDICT,
    "resnmt/study/milestones.py:train_and_score": INSTALLED_VERDICT,
    "resnmt/study/milestones.py:run_plan": INSTALLED_VERDICT,
    "resnmt/study/records.py:cuda_description": "on a GPU only (a study run with --device cuda)",
    "resnmt/export/runner.py:read_dictionary": EXPORT_RUNNER,
    "resnmt/export/runner.py:ProgramStepper.__init__": EXPORT_RUNNER,
    "resnmt/export/runner.py:ProgramStepper.encode": EXPORT_RUNNER,
    "resnmt/export/runner.py:ProgramStepper.step": EXPORT_RUNNER,
    "resnmt/export/runner.py:beam_search": EXPORT_RUNNER,
    "resnmt/export/runner.py:Translator.__init__": EXPORT_RUNNER,
    "resnmt/export/runner.py:Translator.encode": EXPORT_RUNNER,
    "resnmt/export/runner.py:Translator.hypotheses": EXPORT_RUNNER,
    "resnmt/export/runner.py:Translator.translate": EXPORT_RUNNER,
    "resnmt/export/runner.py:main": EXPORT_RUNNER,
    "resnmt/training/fast/capture.py:cuda_capture": CUDA,
    "resnmt/training/fast/capture.py:cuda_capture.capture": CUDA,
    "resnmt/training/fast/capture.py:side_stream_context": CUDA,
    "resnmt/training/fast/capture.py:side_stream_context.on_side_stream": CUDA,
    "resnmt/training/fast/capture.py:StepGraphs.for_cuda": CUDA,
    "resnmt/training/fast/capture.py:StepGraphs.capture_seconds": CUDA,
    "resnmt/training/fast/capture.py:StepGraphs.summary": CUDA,
    "resnmt/training/fast/step.py:FastPathTrainer._all_reduce":
        "tests/test_fast_path.py::test_two_cpu_ranks_on_the_fast_path_train_as_one_process_with_two_batches (slow)",
    "resnmt/training/fast/step.py:FastPathTrainer._cpu_group":
        "tests/test_fast_path.py::test_two_cpu_ranks_on_the_fast_path_train_as_one_process_with_two_batches (slow)",
    "resnmt/training/optim.py:MultiTensorAdam.supports_flat_params":
        "tests/test_fused_adam.py::test_equals_fairseq_adam_on_cuda (--fp16's flat master weights need CUDA)",
}


def functions(report: dict) -> Tuple[List[str], List[str]]:
    """(every function of resnmt/ with statements, those none of whose lines ran), as path:name."""
    every, never = [], []
    for path, data in sorted(report["files"].items()):
        path = path[path.index("resnmt/"):] if "resnmt/" in path else path
        for name, fn in data.get("functions", {}).items():
            if not name or fn["summary"]["num_statements"] == 0:
                continue
            every.append(f"{path}:{name}")
            if fn["summary"]["covered_lines"] == 0:
                never.append(f"{path}:{name}")
    return every, never


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        every, never = functions(json.load(f))
    unexplained = [name for name in never if name not in ELSEWHERE]
    stale = [name for name in ELSEWHERE if name not in never]
    for name in never:
        print(f"{name}: {ELSEWHERE.get(name, 'NEVER EXECUTED: test it or delete it')}")
    for name in stale:
        print(f"{name}: executed by the suite now, or gone: drop it from ELSEWHERE")
    print(f"{len(every)} functions in resnmt/; the default suite never executes {len(never)}: "
          f"{len(never) - len(unexplained)} run elsewhere (listed), {len(unexplained)} nowhere; "
          f"{len(stale)} stale entries")
    return 1 if unexplained or stale else 0


if __name__ == "__main__":
    sys.exit(main())
