"""`tgc`: the command line of tgc-rl.

    tgc serve                          run the control plane (starts a local Ray head unless told otherwise)
    tgc token create --tenant acme     mint a token (printed once; stored hashed)
    tgc submit job.yaml --follow       submit, then show progress until the job ends
    tgc jobs | status ID | logs ID -f | metrics ID | checkpoints ID | cancel ID | resume ID
    tgc train job.yaml                 run a job locally, without the control plane
    tgc schema                         print the job spec's JSON schema

Client commands read the server URL and token from --url/--token or TGC_URL/TGC_TOKEN.
Exit codes: 0 ok, 1 the job failed / an API error, 2 invalid input, 3 server unreachable.
"""

# The client distribution (clients/) ships this module with the SDK and the wire layer only: at module level
# it imports the stdlib alone, and each command that runs here (the server, the trainer, the tasks) imports
# what it needs inside its function and is marked `local=True` (main() names the full install when absent).

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tgc_rl.cli_remote import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_UNREACHABLE,
    cmd_cancel,
    cmd_checkpoints,
    cmd_jobs,
    cmd_logs,
    cmd_metrics,
    cmd_resume,
    cmd_samples,
    cmd_status,
    cmd_submit,
    rest_client,
    timestamp,
)

_FULL_INSTALL_NEEDED = (
    "`tgc {command}` runs on this machine, with the trainer and the server: it needs the full install "
    "(pip install tgc-rl); this is the client only (tgc-rl-client)"
)


def full_install() -> bool:
    """Whether the trainer and the server are installed here (`tgc-rl`), not only the client (`tgc-rl-client`)."""
    return importlib.util.find_spec("tgc_rl.trainer") is not None


# -- server-side commands -------------------------------------------------------------------------
def _settings(args: argparse.Namespace, **extra: Any):
    from tgc_rl.control.settings import ControlSettings

    return ControlSettings.from_env(data_dir=args.data_dir, db_url=args.db_url, **extra)


def cmd_serve(args: argparse.Namespace) -> int:
    from tgc_rl.control.server import serve

    settings = _settings(
        args,
        host=args.host,
        port=args.port,
        ray_address=args.ray_address,
        ray_num_cpus=args.ray_num_cpus,
        scheduler=False if args.no_scheduler else None,
        public_url=args.public_url,
        default_max_concurrent_jobs=args.max_concurrent_jobs,
        cancel_grace_s=args.cancel_grace,
        poll_interval_s=args.poll_interval,
        allow_custom_code=True if args.allow_custom_code else None,
        allow_unsafe_sandbox=True if args.allow_unsafe_sandbox else None,
    )
    serve(settings, log_level=args.log_level)
    return EXIT_OK


def cmd_cluster(args: argparse.Namespace) -> int:
    """The managed local Ray head `tgc serve` starts: its state, or stop it (running jobs end with it)."""
    from tgc_rl.control.ray_cluster import LocalRayCluster

    cluster = LocalRayCluster(_settings(args).data_dir)
    procs = cluster.processes()
    if args.cluster_command == "status":
        where = cluster.dashboard_url if cluster.running() else "not answering"
        print(f"managed Ray head of {cluster.root.parent}: {len(procs)} processes; dashboard {where}")
        return EXIT_OK
    if not procs:
        print(f"no managed Ray head of {cluster.root.parent} is running")
        return EXIT_OK
    cluster.stop()
    print(f"stopped the managed Ray head of {cluster.root.parent} ({len(procs)} processes)")
    return EXIT_OK


def _token_store(args: argparse.Namespace):
    from tgc_rl.control.db import make_engine
    from tgc_rl.control.migrations import migrate
    from tgc_rl.control.tokens import TokenStore

    settings = _settings(args)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.database_url)
    migrate(engine)
    return TokenStore(engine)


def cmd_token_create(args: argparse.Namespace) -> int:
    store = _token_store(args)
    try:
        info, secret = store.create(args.tenant, name=args.name, is_admin=args.admin)
        if args.max_concurrent is not None:
            store.set_quota(args.tenant, args.max_concurrent)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    kind = "admin token" if info.is_admin else "token"
    print(f"created {kind} {info.id} for tenant {info.tenant!r}; it is shown only now:", file=sys.stderr)
    print(secret)  # stdout carries the secret alone: TGC_TOKEN=$(tgc token create ...)
    return EXIT_OK


def cmd_token_list(args: argparse.Namespace) -> int:
    for t in _token_store(args).list(args.tenant):
        status = "revoked" if t.revoked_at else "active"
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(t.created_at))
        print(
            f"{t.id}  {t.tenant:<20} {'admin' if t.is_admin else 'user ':<5}  {status:<7}  {created}  {t.name}"
        )
    return EXIT_OK


def cmd_token_revoke(args: argparse.Namespace) -> int:
    if _token_store(args).revoke(args.token_id):
        print(f"revoked {args.token_id}")
        return EXIT_OK
    print(f"error: no active token {args.token_id}", file=sys.stderr)
    return EXIT_INVALID


def cmd_quota(args: argparse.Namespace) -> int:
    try:
        _token_store(args).set_quota(args.tenant, args.max_concurrent)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    print(f"tenant {args.tenant!r}: at most {args.max_concurrent} concurrent jobs")
    return EXIT_OK


def cmd_train(args: argparse.Namespace) -> int:
    from tgc_rl.trainer.main import train_command

    return train_command(args)


def cmd_plot(args: argparse.Namespace) -> int:
    from tgc_rl.trainer.curves import plot_run

    try:
        print(plot_run(args.run_dir, args.out))
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def cmd_schema(args: argparse.Namespace) -> int:
    if args.remote:  # the schema of the spec the server accepts (the client install has no JobSpec)
        if args.task is not None:
            print(
                "error: --task reads this machine's task registry; drop --remote (full install)",
                file=sys.stderr,
            )
            return EXIT_INVALID
        with rest_client(args) as client:
            print(json.dumps(client.schema(), indent=args.indent))
        return EXIT_OK
    if not full_install():
        print(
            f"error: {_FULL_INSTALL_NEEDED.format(command='schema')} (or ask the server: --remote)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    from tgc_rl.config import JobSpec

    if args.task is None:
        print(json.dumps(JobSpec.model_json_schema(by_alias=True), indent=args.indent))
        return EXIT_OK
    from tgc_rl.tasks.registry import builtin_names, params_model

    model = params_model(args.task)
    if model is None:
        print(
            f"error: {args.task!r} has no declared params (a custom `module:function` task takes free-form "
            f"params); built-in: {', '.join(builtin_names())}",
            file=sys.stderr,
        )
        return EXIT_INVALID
    print(json.dumps(model.model_json_schema(), indent=args.indent))
    return EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate the spec's model (or a checkpoint) on its `eval` rows, locally or (`--remote`) as a job."""
    from tgc_rl.run_layout import EVENTS_FILE, METRICS_FILE, JobState

    if args.remote:
        local = [
            flag for flag, value in (("--checkpoint", args.checkpoint), ("--run-dir", args.run_dir)) if value
        ]
        if local:  # the server runs the job in a run dir of its own, on the model its workers can read
            print(
                f"error: {' and '.join(local)} apply to a local evaluation only; with --remote the server "
                "chooses the run dir and evaluates the spec's model.source (set it to a checkpoint's `model` "
                "directory on the workers' hosts to evaluate a checkpoint)",
                file=sys.stderr,
            )
            return EXIT_INVALID
        with rest_client(args) as client:  # the server validates the spec (Invalid names each bad field)
            job = client.evaluate(args.spec).wait()
            if job.state != JobState.SUCCEEDED:
                print(f"error: evaluation job {job.id} {job.state.value}: {job.reason}", file=sys.stderr)
                return EXIT_FAILED
            metrics = job.metrics()[0].metrics
    elif not full_install():
        print(
            f"error: {_FULL_INSTALL_NEEDED.format(command='eval')} (or evaluate on the server: --remote)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    else:
        from tgc_rl.config import JobSpec, SpecError
        from tgc_rl.resources import ResourceError
        from tgc_rl.tasks import GrantError
        from tgc_rl.trainer.evaluation import CheckpointModel
        from tgc_rl.trainer.main import run

        try:
            spec = JobSpec.from_yaml(args.spec, steps=0)  # the trainer entry's one parse, evaluating only
        except (SpecError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_INVALID
        if args.checkpoint is not None:  # refused here, before Ray and the replicas start
            try:
                checkpoint = CheckpointModel.read(args.checkpoint)
                checkpoint.eval_spec(spec)  # an adapter's model section must fit the rest of the spec
            except ValueError as e:
                print(f"error: --checkpoint: {e}", file=sys.stderr)
                return EXIT_INVALID
            print(f"evaluating {args.checkpoint}: {_CHECKPOINT_KINDS[checkpoint.kind]}")
        run_dir = Path(args.run_dir or f"runs/{spec.name}-eval-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            state = run(spec, run_dir, args.checkpoint)
        except (ResourceError, GrantError) as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_INVALID
        if state != JobState.SUCCEEDED:
            print(f"error: evaluation {state} (see {run_dir / EVENTS_FILE})", file=sys.stderr)
            return EXIT_FAILED
        metrics = json.loads((run_dir / METRICS_FILE).read_text().splitlines()[-1])
        print(f"run dir {run_dir} (each sample's verdict: {run_dir}/eval/step_0.jsonl)")
    print(_eval_table(metrics))
    return EXIT_OK


_CHECKPOINT_KINDS = {
    "full": "its full weights",
    "merged": "its merged LoRA weights",
    "adapter": "its LoRA adapter on the job's base model",
}


def _eval_table(metrics: dict[str, Any]) -> str:
    """The eval/ metrics as an aligned two-column table."""
    rows = [(k, v) for k, v in metrics.items() if k.startswith("eval/") or k == "timing/eval_s"]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(
        f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}" for k, v in rows
    )


def cmd_data_export(args: argparse.Namespace) -> int:
    from tgc_rl.tasks.export import export_rows, write_rows

    try:
        params = json.loads(args.params) if args.params else {}
        rows = export_rows(args.task, params, args.rows, args.seed)
        path = write_rows(rows, args.out)
    except (ValueError, OSError) as e:  # json.JSONDecodeError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    print(f"{path}: {len(rows)} rows of {args.task}")
    return EXIT_OK


def cmd_data_upload(args: argparse.Namespace) -> int:
    with rest_client(args) as client:
        d = client.upload_dataset(args.file, args.name)
    print(f"{d.id}  {d.name}  {d.rows} rows  {d.size_bytes:,} bytes  sha256 {d.sha256[:12]}")
    print(f"use it as  task: {{name: dataset, params: {{dataset_id: {d.id}}}}}")
    return EXIT_OK


def cmd_data_list(args: argparse.Namespace) -> int:
    with rest_client(args) as client:
        found = client.datasets()
    if args.json:
        print(json.dumps([d.model_dump(mode="json") for d in found], indent=2))
        return EXIT_OK
    for d in found:
        print(
            f"{d.id}  {d.name:<32} {d.rows:>8} rows  {d.size_bytes:>12,} bytes  {timestamp(d.created_at)}  "
            f"columns: {', '.join(d.columns)}"
        )
    return EXIT_OK


def cmd_data_rm(args: argparse.Namespace) -> int:
    with rest_client(args) as client:
        for dataset_id in args.dataset_ids:
            client.delete_dataset(dataset_id)
            print(f"{dataset_id}: deleted")
    return EXIT_OK


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; the arguments that import the trainer or the tasks (`train`'s, `data export`'s task
    list) are built only when `command` is theirs, so that the other commands start without those imports."""
    p = argparse.ArgumentParser(
        prog="tgc",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    api = argparse.ArgumentParser(add_help=False)
    api.add_argument(
        "--url", default=None, help="control plane URL (env TGC_URL; default http://127.0.0.1:8080)"
    )
    api.add_argument("--token", default=None, help="bearer token (env TGC_TOKEN)")

    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--data-dir", type=Path, default=None, help="control plane data dir (env TGC_DATA_DIR)")
    db.add_argument(
        "--db-url", default=None, help="database URL (env TGC_DB_URL; default SQLite in the data dir)"
    )

    _operator_commands(sub, db)
    _job_commands(sub, api)
    _local_commands(sub, api, command == "train" and full_install())
    _data_commands(sub, api, command == "data" and full_install())
    return p


def _operator_commands(sub, db: argparse.ArgumentParser) -> None:
    """The operator's: the server, its Ray head, tokens and quotas (they talk to the database directly)."""
    s = sub.add_parser(
        "serve",
        parents=[db],
        help="run the control plane",
        description="Run the control plane. With --ray-address local it starts (or reuses) a Ray head under the "
        "data dir, which KEEPS RUNNING after `tgc serve` exits so that running jobs survive a restart of the "
        "control plane; `tgc cluster stop` stops it (and the jobs on it).",
    )
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument(
        "--ray-address",
        default=None,
        help="`local` (default: a managed local Ray head), a Ray dashboard URL, or `none`",
    )
    s.add_argument("--ray-num-cpus", type=int, default=None, help="logical CPUs of the managed local head")
    s.add_argument("--no-scheduler", action="store_true", help="API only: do not start jobs")
    s.add_argument("--public-url", default=None, help="URL trainers report to (default http://host:port)")
    s.add_argument("--max-concurrent-jobs", type=int, default=None, help="default per-tenant limit")
    s.add_argument(
        "--cancel-grace", type=float, default=None, help="seconds before a cancel becomes a hard stop"
    )
    s.add_argument("--poll-interval", type=float, default=None, help="scheduler period in seconds")
    s.add_argument("--allow-custom-code", action="store_true", help="let tenants run module:function tasks")
    s.add_argument(
        "--allow-unsafe-sandbox",
        action="store_true",
        help="let tenants' jobs run model-written code WITHOUT the sandbox when they ask (see docs/security.md)",
    )
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=cmd_serve, local=True)

    cl = sub.add_parser("cluster", help="the managed local Ray head that `tgc serve` starts: status, stop")
    cl.add_argument("cluster_command", choices=["status", "stop"], metavar="{status,stop}")
    cl.add_argument("--data-dir", type=Path, default=None, help="control plane data dir (env TGC_DATA_DIR)")
    cl.set_defaults(func=cmd_cluster, db_url=None, local=True)

    t = sub.add_parser("token", help="manage bearer tokens (talks to the database directly)")
    tsub = t.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    tc = tsub.add_parser("create", parents=[db], help="create a token; prints it once")
    tc.add_argument("--tenant", required=True)
    tc.add_argument("--name", default="", help="a label, e.g. who holds it")
    tc.add_argument("--admin", action="store_true", help="may see and control every tenant's jobs")
    tc.add_argument(
        "--max-concurrent", type=int, default=None, help="also set the tenant's concurrent-job quota"
    )
    tc.set_defaults(func=cmd_token_create, local=True)
    tl = tsub.add_parser("list", parents=[db], help="list tokens (never their secrets)")
    tl.add_argument("--tenant", default=None)
    tl.set_defaults(func=cmd_token_list, local=True)
    tr = tsub.add_parser("revoke", parents=[db], help="revoke a token by id")
    tr.add_argument("token_id")
    tr.set_defaults(func=cmd_token_revoke, local=True)

    q = sub.add_parser("quota", parents=[db], help="set a tenant's limit on concurrent jobs")
    q.add_argument("tenant")
    q.add_argument("max_concurrent", type=int)
    q.set_defaults(func=cmd_quota, local=True)


def _job_commands(sub, api: argparse.ArgumentParser) -> None:
    """A tenant's, over REST: submit and follow jobs."""
    sm = sub.add_parser("submit", parents=[api], help="submit a job spec (YAML)")
    sm.add_argument("spec", type=Path)
    sm.add_argument("--follow", "-f", action="store_true", help="show progress until the job ends")
    sm.add_argument("--dry-run", action="store_true", help="only validate on the server")
    sm.add_argument("--idempotency-key", default=None, help="retries with the same key return the same job")
    sm.add_argument("--quiet", "-q", action="store_true", help="print only the job id")
    sm.set_defaults(func=cmd_submit)

    j = sub.add_parser("jobs", parents=[api], help="list jobs")
    j.add_argument("--state", action="append", default=None, help="filter by state (repeatable)")
    j.add_argument("--limit", type=int, default=50)
    j.add_argument("--tenant", default=None, help="admin: one tenant's jobs")
    j.add_argument("--json", action="store_true")
    j.set_defaults(func=cmd_jobs)

    st = sub.add_parser("status", parents=[api], help="show a job's record and history")
    st.add_argument("job_id")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    lg = sub.add_parser("logs", parents=[api], help="print a job's log lines")
    lg.add_argument("job_id")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    lg.add_argument("--driver", action="store_true", help="the Ray driver's stdout/stderr instead")
    lg.set_defaults(func=cmd_logs)

    m = sub.add_parser("metrics", parents=[api], help="print a job's per-step metrics")
    m.add_argument("job_id")
    m.add_argument("--since-step", type=int, default=None)
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_metrics)

    ck = sub.add_parser("checkpoints", parents=[api], help="list a job's checkpoints")
    ck.add_argument("job_id")
    ck.set_defaults(func=cmd_checkpoints)

    sp = sub.add_parser(
        "samples", parents=[api], help="show what the policy wrote at a step (rollout traces)"
    )
    sp.add_argument("job_id")
    sp.add_argument("--step", type=int, default=None, help="the step (default: the newest with samples)")
    sp.add_argument("--worst", action="store_true", help="only each group's worst response")
    sp.add_argument("--limit", type=int, default=20, metavar="K", help="at most K records (1-200)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_samples)

    c = sub.add_parser("cancel", parents=[api], help="cancel a job (graceful: checkpoint, then stop)")
    c.add_argument("job_id")
    c.add_argument("--reason", default="cancelled from the CLI")
    c.add_argument("--wait", action="store_true", help="wait until it has stopped")
    c.set_defaults(func=cmd_cancel)

    r = sub.add_parser("resume", parents=[api], help="resume a failed/cancelled job from a checkpoint")
    r.add_argument("job_id")
    r.add_argument("--checkpoint", default=None, help="a checkpoint path or step_<N> (default: newest)")
    r.add_argument("--follow", "-f", action="store_true")
    r.set_defaults(func=cmd_resume)


def _local_commands(sub, api: argparse.ArgumentParser, train: bool) -> None:
    """Run, evaluate and plot here, and print the schemas."""
    tr2 = sub.add_parser("train", help="run a job locally, in this process (no control plane)")
    if train:
        from tgc_rl.trainer.main import add_train_arguments

        add_train_arguments(tr2)
    else:  # another command runs, or the client alone (main() says what to install)
        tr2.add_argument("arguments", nargs=argparse.REMAINDER)
    tr2.set_defaults(func=cmd_train, local=True)

    ev = sub.add_parser(
        "eval",
        parents=[api],
        help="evaluate a model or checkpoint on the spec's `eval` rows without training; prints a table",
    )
    ev.add_argument("spec", type=Path)
    ev.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="a checkpoint dir: full weights, a LoRA job's merged weights or its adapter on the job's base "
        "(default: the spec's model)",
    )
    ev.add_argument("--run-dir", type=Path, default=None, help="default runs/<name>-eval-<time>")
    ev.add_argument(
        "--remote", action="store_true", help="run it as a job on the control plane (--url/--token)"
    )
    ev.set_defaults(func=cmd_eval)

    pl = sub.add_parser(
        "plot", help="draw a run's curves (reward, accuracy, residuals, entropy) into RUN_DIR/curves.png"
    )
    pl.add_argument("run_dir", type=Path)
    pl.add_argument("--out", type=Path, default=None, help="another file name (default RUN_DIR/curves.png)")
    pl.set_defaults(func=cmd_plot, local=True)

    sc = sub.add_parser("schema", parents=[api], help="print the job spec's JSON schema")
    sc.add_argument("--indent", type=int, default=2)
    sc.add_argument("--remote", action="store_true", help="the server's (--url/--token), not this install's")
    sc.add_argument(
        "--task",
        default=None,
        help="print this task's `task.params` schema instead (fields marked `privilege` need the operator)",
    )
    sc.set_defaults(func=cmd_schema)


def _data_commands(sub, api: argparse.ArgumentParser, task_names: bool) -> None:
    """Datasets: export built-in tasks to files; upload, list and remove a tenant's own."""
    dt = sub.add_parser("data", help="datasets: export a built-in task to a file; upload, list, remove yours")
    dsub = dt.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    de = dsub.add_parser("export", help="write a built-in task's items as a JSONL or Parquet dataset")
    if task_names:
        from tgc_rl.tasks.registry import builtin_names

        de.add_argument("--task", required=True, help=", ".join(builtin_names(exportable_only=True)))
    else:
        de.add_argument("--task", required=True, help="a built-in task")
    de.add_argument("--params", default=None, help="the task's params as JSON, e.g. '{\"max_operand\": 20}'")
    de.add_argument("--rows", type=int, default=100)
    de.add_argument("--seed", type=int, default=0)
    de.add_argument("--out", type=Path, required=True, help="a .jsonl or .parquet file")
    de.set_defaults(func=cmd_data_export, local=True)
    du = dsub.add_parser("upload", parents=[api], help="upload a JSONL / Parquet / CSV file; prints its id")
    du.add_argument("file", type=Path)
    du.add_argument(
        "--name", default=None, help="name on the server (default: the file's; the suffix is the format)"
    )
    du.set_defaults(func=cmd_data_upload)
    dl = dsub.add_parser("list", parents=[api], help="list your datasets")
    dl.add_argument("--json", action="store_true")
    dl.set_defaults(func=cmd_data_list)
    dr = dsub.add_parser("rm", parents=[api], help="delete datasets")
    dr.add_argument("dataset_ids", nargs="+")
    dr.set_defaults(func=cmd_data_rm)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    if getattr(args, "local", False) and not full_install():
        print(f"error: {_FULL_INSTALL_NEEDED.format(command=args.command)}", file=sys.stderr)
        return EXIT_INVALID
    from tgc_rl.sdk.errors import Invalid, TgcError, Unavailable

    try:
        return args.func(args)
    except Invalid as e:
        print(f"error: {e.message}", file=sys.stderr)
        return EXIT_INVALID
    except Unavailable as e:
        print(f"error: {e.message}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except TgcError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return EXIT_INVALID if e.status is None else EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
