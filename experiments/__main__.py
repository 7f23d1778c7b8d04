"""`python -m experiments <command>`: one command per study, the CI-sized version, the report.

    python -m experiments ci                      # CI-sized testbeds 1-2 + report (minutes on 2 cores)
    python -m experiments tabular                 # testbed 1, full study (then rewrites REPORT.md)
    python -m experiments tinylm                  # testbed 2, full study
    python -m experiments tinylm --groups main --objectives grpo,cp_grpo --seeds 0,1,2   # a part of it
    python -m experiments trainer --size small    # testbed 3 through the real trainer, here
    python -m experiments trainer --size full --objectives grpo,cp_grpo --tasks arithmetic   # a part of it
    python -m experiments testbed4 --objectives cp_grpo --seeds 0 --commit   # testbed 4 (plan: testbed4_plan.md)
    python -m experiments testbed5 pilot --commit --lock /tmp/tgc-heavy.lock   # testbed 5's pilot (testbed5_plan.md)
    python -m experiments testbed5 study --commit --lock /tmp/tgc-heavy.lock   # then its runs (refused before the pilot)
    python -m experiments sweep submit|collect    # testbed 3 as a sweep of control-plane jobs
    python -m experiments report                  # figures + REPORT.md from experiments/results/

Long studies are resumable: finished runs are cached under experiments/.cache/ (or $TGC_EXPERIMENTS_CACHE);
testbed 3 also keeps each run's summary beside its results (results/trainer_runs/), so it resumes on any machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments import paths

NOTES = paths.ROOT / "notes.md"


def _report(results_dir: Path, report_path: Path, notes: Path | None = NOTES) -> None:
    from experiments.report import write_report

    print(f"report: {write_report(results_dir, report_path, notes_path=notes)}")


def _study(
    testbed: str, size: str, out: Path, workers: int, cache: Path, args: argparse.Namespace | None = None
) -> Path:
    from experiments.runner import run_study
    from experiments.studies import STUDIES

    study = STUDIES[testbed](size)
    runs = None
    if args is not None and (args.objectives or args.groups or args.seeds):
        try:
            runs = study.select(args.objectives, args.groups, args.seeds)
        except ValueError as exc:
            raise SystemExit(f"python -m experiments {testbed}: {exc}") from None
    return run_study(study, out, workers=workers, cache=cache, runs=runs)


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in _names(text)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in _names(text)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from exc


def _testbed5(args: argparse.Namespace) -> int:
    import json

    from experiments import testbed5

    if args.action == "pilot":
        testbed5.run_pilot(args.cache, commit=args.commit, lock=args.lock)
        return 0
    try:  # the study's specs are refused before the pilot has decided, or for seeds outside the design
        specs = testbed5.study_specs(seeds=args.seeds)
    except (testbed5.NoPilotDecision, ValueError) as exc:
        raise SystemExit(f"python -m experiments testbed5 {args.action}: {exc}") from None
    if args.action == "specs":
        print(json.dumps(specs, indent=1))
    else:
        testbed5.run_study(args.seeds, args.out or testbed5.RUNS, args.cache, args.commit, args.lock)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, out_default: Path) -> None:
        p.add_argument(
            "--out", type=Path, default=out_default, help=f"results directory (default {out_default})"
        )
        p.add_argument("--cache", type=Path, default=paths.CACHE, help="per-run cache (resume)")
        p.add_argument("--workers", type=int, default=1, help="worker processes (one core each)")
        p.add_argument("--no-report", action="store_true", help="do not rewrite the report afterwards")

    p_ci = sub.add_parser("ci", help="CI-sized testbeds 1-2 and their report (minutes)")
    common(p_ci, paths.CACHE / "ci")  # not committed: CI output is checked, not kept
    for name, helptext in (
        ("tabular", "testbed 1: tabular toy on rlcore objectives"),
        ("tinylm", "testbed 2: tiny transformer trained from scratch"),
    ):
        p = sub.add_parser(name, help=helptext)
        common(p, paths.RESULTS)
        p.add_argument("--size", choices=("full", "ci"), default="full")
        # A part of the study (the cache keeps it; the results file and report cover every cached run).
        p.add_argument(
            "--objectives", type=_names, default=None, help="run only these objectives (comma-separated)"
        )
        p.add_argument(
            "--groups", type=_names, default=None, help="run only these groups (main, epochs, split, ...)"
        )
        p.add_argument("--seeds", type=_ints, default=None, help="run only these seeds (comma-separated)")
    p_tr = sub.add_parser("trainer", help="testbed 3: SmolLM2-135M through the real trainer, run here")
    common(p_tr, paths.RESULTS)
    p_tr.add_argument("--size", choices=("small", "full", "tiny"), default="small")
    p_tr.add_argument(
        "--objectives", type=_names, default=None, help="run only these objectives (comma-separated)"
    )
    p_tr.add_argument("--tasks", type=_names, default=None, help="run only these tasks (comma-separated)")
    p_tr.add_argument("--seeds", type=_ints, default=None, help="run only these seeds (comma-separated)")
    p_t4 = sub.add_parser("testbed4", help="testbed 4: 150-step runs through the real trainer, probed")
    p_t4.add_argument("--objectives", type=_names, default=None, help="default: all six (comma-separated)")
    p_t4.add_argument("--seeds", type=_ints, default=None, help="default: 0,1,2")
    p_t4.add_argument(
        "--lrs", type=_floats, default=None, help="learning rates (the sweep; default: the plan's)"
    )
    p_t4.add_argument("--steps", type=int, default=None, help="steps a run (default: the plan's 150)")
    p_t4.add_argument("--out", type=Path, default=None, help="run summaries (default results/testbed4_runs)")
    p_t4.add_argument("--cache", type=Path, default=paths.CACHE, help="run directories (resume)")
    p_t4.add_argument("--commit", action="store_true", help="git-commit each run's summary as it is written")
    p_t4.add_argument("--lock", type=Path, default=None, help="hold this file's lock while a run trains")
    p_t5 = sub.add_parser(
        "testbed5", help="testbed 5: its pilot, then grpo vs cp_grpo (plan: testbed5_plan.md)"
    )
    p_t5.add_argument(
        "action",
        choices=("pilot", "study", "specs"),
        help="pilot: the steps not yet decided; study: the runs (needs the pilot's decisions); specs: print them",
    )
    p_t5.add_argument(
        "--seeds", type=_ints, default=None, help="study: only these seeds (default: the design's)"
    )
    p_t5.add_argument("--out", type=Path, default=None, help="run summaries (default results/testbed5_runs)")
    p_t5.add_argument("--cache", type=Path, default=paths.CACHE, help="run directories (resume)")
    p_t5.add_argument("--commit", action="store_true", help="git-commit each decision and run summary")
    p_t5.add_argument("--lock", type=Path, default=None, help="hold this file's lock while a job runs")
    p_sw = sub.add_parser("sweep", help="testbed 3 as control-plane jobs (SDK)")
    p_sw.add_argument("action", choices=("submit", "collect"))
    p_sw.add_argument("--size", choices=("small", "full", "tiny"), default="small")
    p_sw.add_argument("--url", default=None, help="control plane URL (default $TGC_URL)")
    p_sw.add_argument("--token", default=None, help="bearer token (default $TGC_TOKEN)")
    p_sw.add_argument("--manifest", type=Path, default=None, help="manifest JSON (job ids)")
    p_sw.add_argument("--out", type=Path, default=paths.RESULTS)
    p_sw.add_argument("--no-wait", action="store_true", help="collect only jobs that have finished")
    p_rep = sub.add_parser("report", help="figures and REPORT.md from a results directory")
    p_rep.add_argument("--results", type=Path, default=paths.RESULTS)
    p_rep.add_argument(
        "--report",
        type=Path,
        default=None,
        help="default: experiments/REPORT.md for the committed results, else <results>/REPORT.md",
    )
    args = parser.parse_args(argv)

    if args.command == "report":
        target = args.report or (
            paths.REPORT if args.results.resolve() == paths.RESULTS.resolve() else args.results / "REPORT.md"
        )
        _report(args.results, target, NOTES if target == paths.REPORT else None)
        return 0
    if args.command == "sweep":
        from experiments import sweep
        from tgc_rl.sdk import Client

        manifest = args.manifest or sweep.DEFAULT_MANIFEST
        with Client(args.url, args.token) as client:
            if args.action == "submit":
                sweep.submit(client, args.size, manifest)
            else:
                sweep.collect(client, manifest, args.out, wait=not args.no_wait)
                _report(
                    args.out,
                    paths.REPORT if args.out.resolve() == paths.RESULTS.resolve() else args.out / "REPORT.md",
                )
        return 0
    if args.command == "testbed4":
        from experiments import testbed4

        try:
            runs = testbed4.select(args.objectives, args.seeds, args.lrs, args.steps)
        except ValueError as exc:
            raise SystemExit(f"python -m experiments testbed4: {exc}") from None
        testbed4.run_study(runs, args.out or testbed4.RUNS, args.cache, commit=args.commit, lock=args.lock)
        return 0
    if args.command == "testbed5":
        return _testbed5(args)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    if args.command == "ci":
        _study("tabular", "ci", args.out, args.workers, args.cache)
        _study("tinylm", "ci", args.out, args.workers, args.cache)
        if not args.no_report:
            _report(args.out, args.out / "REPORT.md", None)
        return 0
    if args.command == "trainer":
        from experiments.trainer_study import run_local, select_runs

        try:
            runs = select_runs(args.size, args.objectives, args.tasks, args.seeds)
        except ValueError as exc:
            raise SystemExit(f"python -m experiments trainer: {exc}") from None
        run_local(args.size, args.out, args.cache, runs=runs)
    else:
        _study(args.command, args.size, args.out, args.workers, args.cache, args)
    if not args.no_report:
        main_results = args.out.resolve() == paths.RESULTS.resolve()
        _report(
            args.out,
            paths.REPORT if main_results else args.out / "REPORT.md",
            NOTES if main_results else None,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
