"""Trainer entrypoint: `python -m tgc_rl.trainer --spec job.yaml --run-dir DIR [--resume [CKPT]]`.

Runs as a Ray job driver (under the control plane) or locally (`tgc train`). Starts a local Ray cluster
when none is given, checks that the spec's resources can be placed before any actor starts, turns SIGTERM
into a graceful stop at the next step boundary, and always tears its actors down.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from tgc_rl.config import JobSpec, SpecError
from tgc_rl.resources import ResourceError, check_resources, required_resources
from tgc_rl.run_layout import (
    CHECKPOINTS_DIR,
    CURVES_FILE,
    ENDED_OK,
    HEADLINE_METRICS,
    LOGS_DIR,
    METRICS_FILE,
    SPEC_FILE,
    TRAINER_STATE_FILE,
    JobState,
)
from tgc_rl.tasks.grants import GrantError
from tgc_rl.trainer.reporting import Reporter

log = logging.getLogger("tgc.trainer")

LOCAL_OVERSUBSCRIPTION = 4
UNSAFE_HELP = (
    "let this job run model-written code WITHOUT the bubblewrap sandbox when its spec asks for "
    "`task.params.sandbox: unsafe_local` (trusted code only; a spec alone never can)"
)  # a local cluster may promise this many logical CPUs per core, no more


class ResumeMismatch(ValueError):
    """A resume whose spec would train something else than the checkpoint was trained on."""


# What a resume may change: how long the run goes, what it is called, where it runs, how it is checkpointed,
# evaluated and traced. Everything else (model, task, objective, group_size, sampling, optim, seed, ...) decides
# what is trained, and the checkpoint's optimizer state and data position only mean something under it.
RESUME_MAY_CHANGE = frozenset({"name", "steps", "checkpoint", "eval", "traces", "trackers", "resources"})


def check_resume(spec: JobSpec, checkpoint: Path) -> None:
    """Refuse to resume `checkpoint` with a spec that changes what is trained, naming each changed field."""
    state_file = checkpoint / TRAINER_STATE_FILE
    if not state_file.is_file():
        return  # not a complete checkpoint: loading it fails with its own message
    stored = json.loads(state_file.read_text()).get("spec")
    if not isinstance(stored, dict):
        return  # written before checkpoints kept their spec: nothing to compare with
    try:
        # a checkpoint's stored spec, parsed only to compare it with the running one (today's defaults on both sides)
        stored = JobSpec.parse(stored).to_dict()
    except SpecError:
        pass  # a spec today's schema refuses: compare what was written
    changed = [
        f"{path} ({before!r} -> {after!r})"
        for path, before, after in _differences(stored, spec.to_dict())
        if path.split(".", 1)[0] not in RESUME_MAY_CHANGE
    ]
    if changed:
        raise ResumeMismatch(
            f"resume from {checkpoint}: the spec changes what is trained: {'; '.join(changed)}. Resume with the "
            f"spec the checkpoint was trained with (its run directory's {SPEC_FILE}), or start a new run; a resume "
            f"may change only {', '.join(sorted(RESUME_MAY_CHANGE))}"
        )


def _differences(a: object, b: object, path: str = "") -> list[tuple[str, object, object]]:
    """(dotted path, a's value, b's value) for each leaf where `a` and `b` differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(a.keys() | b.keys())
            for d in _differences(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        ]
    return [] if a == b else [(path, a, b)]


def check_grants(spec: JobSpec) -> None:
    """Refuse (GrantError) a spec that needs a privilege this job lacks: the worker's own check, behind the
    control plane's."""
    from tgc_rl.tasks.grants import job_grants, require_grants

    require_grants(spec.privileges(), job_grants())


class EvalStopped(Exception):
    """SIGTERM/SIGINT during an evaluation-only job: it has no step boundary to stop at, so it stops at once."""


def allow_unsafe_sandbox() -> None:
    """`--allow-unsafe-sandbox`: the operator running this process lets its job run code unconfined."""
    from tgc_rl.tasks.grants import GRANTS_ENV, UNSAFE_SANDBOX, encode_grants, job_grants

    os.environ[GRANTS_ENV] = encode_grants(job_grants() | {UNSAFE_SANDBOX})


def local_capacity() -> dict[str, float]:
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count()
    except ImportError:
        pass
    return {"CPU": float((os.cpu_count() or 1) * LOCAL_OVERSUBSCRIPTION), "GPU": float(gpus)}


# glibc serves allocations over 32 MiB (logits chunks, gradients of the embedding, vLLM's activations) with a
# fresh mmap and unmaps them on free, so every step page-faults them in again. Serving them from the heap and
# keeping freed memory (a process's RSS then stays at its peak, which the next step needs anyway) made a
# learner step 1.24x and generation 1.16x faster on CPU, system time 9.1 -> 2.9 s and 5.3 -> 2.7 s a run
# (benchmarks/allocator.py).
# glibc's own variables for glibc.malloc.mmap_max and .trim_threshold (GLIBC_TUNABLES would need a ':', which
# Ray's runtime_env cuts off); set for the job's actors unless the environment sets them already.
ALLOCATOR_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(16 * 2**30)}


def actor_env() -> dict[str, str]:
    """Environment variables of every actor of a job (Ray's runtime_env)."""
    env = {"RAY_DEDUP_LOGS": "0"}
    for key, value in ALLOCATOR_ENV.items():
        env[key] = os.environ.get(key, value)
    return env


def init_ray(spec: JobSpec) -> bool:
    """Connect to the cluster this driver runs in, or start a local one. Returns True if we started it."""
    import ray

    if ray.is_initialized():
        check_resources(spec, ray.cluster_resources())
        return False
    env = actor_env()
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", runtime_env={"env_vars": env}, log_to_driver=True)
        check_resources(spec, ray.cluster_resources())
        return False
    cap = local_capacity()
    check_resources(spec, cap)
    need = required_resources(spec)
    # A local run's console is the user's: actors' and engines' output goes to the run dir (save_actor_logs),
    # and Ray's own notices (that it started, that token auth is on by default) stay out of it.
    ray.init(
        num_cpus=int(max(need["CPU"] + 1, os.cpu_count() or 1)),
        num_gpus=int(cap["GPU"]),
        include_dashboard=False,
        runtime_env={"env_vars": env},
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    return True


def save_actor_logs(run_dir: Path) -> Path | None:
    """Copy this job's actor and engine logs (Ray's worker-*.out/err of this job id) into RUN_DIR/logs/."""
    import shutil

    import ray

    try:
        logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
        job = ray.get_runtime_context().get_job_id()
    except Exception:  # no Ray node in this process (e.g. a client connection): Ray keeps them
        return None
    out = run_dir / LOGS_DIR
    out.mkdir(exist_ok=True)
    for f in logs.glob(f"worker-*-{job}-*.out"):
        pid = f.stem.rsplit("-", 1)[-1]
        with open(f, errors="replace") as fh:  # Ray's header names the actor class: `:actor_name:Learner`
            head = [fh.readline() for _ in range(3)]
        names = [ln.split(":actor_name:", 1)[1].strip() for ln in head if ln.startswith(":actor_name:")]
        name = "".join(c if c.isalnum() or c in "-_" else "_" for c in (names[0] if names else "worker"))
        for suffix in (".out", ".err"):
            if f.with_suffix(suffix).exists():
                shutil.copyfile(f.with_suffix(suffix), out / f"{name}-{pid}{suffix}")
    return out


def run(
    spec: JobSpec, run_dir: Path, resume: str | Path | None = None, progress: bool | None = None
) -> JobState:
    """Run a whole job; returns its final state: succeeded, cancelled or failed.

    Raises ResourceError or ResumeMismatch (after reporting the job failed) when it refuses to start."""
    from tgc_rl.trainer.checkpoints import Checkpoints

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    reporter = Reporter.from_env(run_dir)
    checkpoint: Path | None = None
    if resume is not None:
        checkpoint = (
            Path(resume)
            if str(resume) not in ("", "latest")
            else Checkpoints(run_dir / CHECKPOINTS_DIR, spec.checkpoint.keep_last).latest()
        )
        if checkpoint is None:
            reporter.log("resume requested but no checkpoint exists; starting fresh")
    if checkpoint is not None and spec.steps > 0:  # evaluating a checkpoint may use any spec
        try:
            check_resume(spec, checkpoint)  # before spec.yaml is written: the run dir keeps the one it ran
        except ResumeMismatch as e:
            reporter.state(JobState.FAILED, str(e), 0)
            raise
    spec_file, text = run_dir / SPEC_FILE, spec.to_yaml()
    if (
        not spec_file.is_file() or spec_file.read_text() != text
    ):  # the scheduler wrote it already when it ran it
        spec_file.write_text(text)

    trainer = None
    started_ray = False

    def stop(reason: str) -> None:
        if trainer is not None:
            trainer.stop_reason = reason  # the loop checkpoints and stops at the next step boundary
        elif spec.steps == 0:
            raise EvalStopped(reason)

    previous = _install_stop_handlers(stop)
    try:
        check_grants(spec)
        started_ray = init_ray(spec)
        if spec.steps == 0:  # evaluate only: the spec's model, or the checkpoint's
            from tgc_rl.trainer.evaluation import run_eval_only

            reporter.state(JobState.RUNNING, "evaluating", 0)
            run_eval_only(spec, run_dir, checkpoint, reporter)
            reporter.state(JobState.SUCCEEDED, "evaluated" + (f" {checkpoint}" if checkpoint else ""), 0)
            return JobState.SUCCEEDED
        from tgc_rl.trainer.loop import Trainer

        trainer = Trainer(spec, run_dir, reporter, checkpoint, progress)
        return trainer.run()
    except EvalStopped as e:
        reporter.state(JobState.CANCELLED, str(e), 0)
        return JobState.CANCELLED
    except (ResourceError, GrantError) as e:
        reporter.state(JobState.FAILED, str(e), 0)
        raise
    except BaseException as e:
        step = trainer.step if trainer else 0
        reason = f"{type(e).__name__}: {e}"
        reporter.log(traceback.format_exc())
        reporter.state(JobState.FAILED, reason, step)
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        log.error("job failed at step %d: %s", step, reason)
        return JobState.FAILED
    finally:
        _write_curves(run_dir)  # before the trainer's shutdown, which hands it to the trackers
        if trainer is not None:
            trainer.shutdown()
        reporter.flush()
        _restore_handlers(previous)
        if started_ray or os.environ.get("RAY_ADDRESS"):
            save_actor_logs(run_dir)
        if started_ray:
            import ray

            ray.shutdown()


def _write_curves(run_dir: Path) -> None:
    from tgc_rl.trainer.curves import plot_run

    try:
        plot_run(run_dir)
    except Exception as e:  # no steps yet, or no matplotlib: the JSONL record is what counts
        log.info("no curves.png for %s: %s", run_dir, e)


def summary(spec: JobSpec, run_dir: Path, state: JobState) -> str:
    """The closing lines of a run on the console: outcome, first and last figures, where things are."""
    from tgc_rl.trainer.metrics import read_metrics

    lines = [f"{spec.name}: {state} (run dir {run_dir})"]
    try:
        rows = read_metrics(run_dir)
    except (OSError, ValueError):
        rows = []
    for m in HEADLINE_METRICS:
        seen = [r for r in rows if m.name in r]
        if seen:
            first, last = seen[0], seen[-1]
            lines.append(
                f"  {m.label}: {first[m.name]:.3g} (step {first['step']}) -> {last[m.name]:.3g} "
                f"(step {last['step']})"
            )
    for name in (CURVES_FILE, METRICS_FILE, LOGS_DIR):
        if (run_dir / name).exists():
            lines.append(f"  {name}: {run_dir / name}")
    return "\n".join(lines)


def _install_stop_handlers(stop) -> dict:
    previous: dict = {}
    if threading.current_thread() is not threading.main_thread():  # signals only reach the main thread
        return previous

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        log.warning("%s received: stopping at the next step boundary (checkpoint, then exit)", name)
        stop(f"{name} received")
        signal.signal(signum, previous.get(signum, signal.SIG_DFL))  # a second signal acts at once

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, on_signal)
    return previous


def _restore_handlers(previous: dict) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def add_train_arguments(parser: argparse.ArgumentParser, spec_flag: bool = False) -> None:
    """The arguments of a local run, shared by `tgc train` and `python -m tgc_rl.trainer`."""
    if spec_flag:
        parser.add_argument("--spec", dest="spec", required=True, type=Path, help="job spec YAML")
    else:
        parser.add_argument("spec", type=Path, help="job spec YAML")
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="run directory (default runs/<name>-<time>)"
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        help="resume from a checkpoint directory (default: the run dir's latest)",
    )
    parser.add_argument("--allow-unsafe-sandbox", action="store_true", help=UNSAFE_HELP)


def train_command(args: argparse.Namespace) -> int:
    """Run the job of `args` (add_train_arguments) here; exit status 0 done, 1 failed, 2 refused."""
    try:  # parse 3 of 3 (docs/architecture.md): spec.yaml, where the job's own process starts
        spec = JobSpec.from_yaml(args.spec)
    except (SpecError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.allow_unsafe_sandbox:
        allow_unsafe_sandbox()
    run_dir = Path(args.run_dir or f"runs/{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        state = run(spec, run_dir, args.resume)
    except (ResourceError, ResumeMismatch, GrantError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summary(spec, run_dir, state))
    return 0 if state in ENDED_OK else 1


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tgc_rl.trainer", description=__doc__.split("\n")[0])
    add_train_arguments(parser, spec_flag=True)  # the control plane's entrypoint names the spec with --spec
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return train_command(args)
