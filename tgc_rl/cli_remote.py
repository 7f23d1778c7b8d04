"""`tgc`'s remote commands: the ones that talk to a control plane over REST (submit, jobs, status, logs,
metrics, checkpoints, samples, cancel, resume), the client they share, and how they print a job.

Shipped by the client distribution (clients/): at module level it imports the stdlib alone; the SDK and rich
are imported where a command runs.
"""

from __future__ import annotations

import argparse
import json
import time

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_UNREACHABLE = 0, 1, 2, 3


# -- client commands ------------------------------------------------------------------------------
def rest_client(args: argparse.Namespace):
    from tgc_rl.sdk import Client

    return Client(args.url, args.token)


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def timestamp(dt) -> str:
    return dt.astimezone().strftime("%Y-%m-%d %H:%M:%S") if dt else "-"


def _print_record(job, console) -> None:
    r = job.record
    console.print(f"[bold]{r.id}[/bold]  {r.name}  (tenant {r.tenant}, attempt {r.attempt})")
    console.print(f"  state     {_state_markup(r.state.value)}  {r.reason}")
    step = f"{r.step if r.step is not None else '-'} / {r.total_steps}"
    console.print(f"  step      {step}")
    console.print(
        f"  created   {timestamp(r.created_at)}   started {timestamp(r.started_at)}   finished {timestamp(r.finished_at)}"
    )
    if r.cancel_requested:
        console.print(
            f"  cancel    requested: {r.cancel_reason}" + ("  (stopped hard)" if r.hard_stopped else "")
        )
    if r.run_dir:
        console.print(f"  run dir   {r.run_dir}")
    if r.latest_metrics:
        console.print("  metrics   " + _metrics_text(r.latest_metrics, 8))
    console.print("  history")
    for t in r.transitions:
        console.print(f"    {timestamp(t.time)}  {t.state.value:<9}  {t.reason}")


_STATE_COLORS = {
    "queued": "yellow",
    "starting": "cyan",
    "running": "blue",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "magenta",
}


def _state_markup(state: str) -> str:
    color = _STATE_COLORS.get(state, "white")
    return f"[{color}]{state}[/{color}]"


def _metrics_text(metrics: dict[str, float | None], n: int = 4) -> str:
    """The first `n` metrics, the headline ones first (tgc_rl/run_layout.py), then by name."""
    from tgc_rl.run_layout import HEADLINE_METRICS

    rank = {h.name: i for i, h in enumerate(HEADLINE_METRICS)}
    keys = sorted(metrics, key=lambda k: (rank.get(k, len(rank)), k))[:n]
    return "  ".join(f"{k}={metrics[k]:.4g}" if metrics[k] is not None else f"{k}=nan" for k in keys)


def follow_job(job, console) -> int:
    """Show a job's progress until it ends: a progress bar over steps, state changes and log lines."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tgc_rl.run_layout import ENDED_OK

    bar = Progress(
        TextColumn("[bold]{task.description}"),
        TextColumn("{task.fields[state]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[metrics]}"),
        console=console,
    )
    with bar:
        task = bar.add_task(
            job.id,
            total=job.record.total_steps,
            completed=job.record.step or 0,
            state=_state_markup(job.state.value),
            metrics="",
        )
        for ev in job.stream():
            d = ev.data
            if ev.type == "step":
                text = _metrics_text(d.get("metrics") or {})
                bar.update(task, completed=d.get("step", 0), metrics=text)
                if not console.is_terminal:  # no live bar in a log file: one line per step instead
                    bar.console.print(
                        f"{timestamp(ev.time)}  step {d.get('step')}/{job.record.total_steps}  {text}"
                    )
            elif ev.type == "state" and d.get("source") == "control":  # the record's transitions
                bar.update(task, state=_state_markup(str(d.get("state"))))
                bar.console.print(
                    f"{timestamp(ev.time)}  state {_state_markup(str(d.get('state')))}: {d.get('reason', '')}"
                )
            elif ev.type == "checkpoint":
                bar.console.print(
                    f"{timestamp(ev.time)}  checkpoint at step {d.get('step')}: {d.get('path')}"
                )
            elif ev.type == "log":
                bar.console.print(f"{timestamp(ev.time)}  {d.get('message', '')}", markup=False)
    r = job.record
    console.print(f"{r.id}: {_state_markup(r.state.value)} — {r.reason}")
    return EXIT_OK if r.state in ENDED_OK else EXIT_FAILED


def cmd_submit(args: argparse.Namespace) -> int:
    console = _console()
    with rest_client(args) as client:
        if args.dry_run:
            client.validate(args.spec)
            console.print(f"{args.spec}: valid")
            return EXIT_OK
        job = client.submit(args.spec, idempotency_key=args.idempotency_key)
        if args.quiet:
            print(job.id)
        else:
            console.print(f"submitted {job.id} ({job.record.name}): {_state_markup(job.state.value)}")
        return follow_job(job, console) if args.follow else EXIT_OK


def cmd_jobs(args: argparse.Namespace) -> int:
    console = _console()
    with rest_client(args) as client:
        jobs = client.jobs(args.state, limit=args.limit, tenant=args.tenant)
    if args.json:
        print(json.dumps([j.record.model_dump(mode="json") for j in jobs], indent=2))
        return EXIT_OK
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("ID", "NAME", "TENANT", "STATE", "STEP", "CREATED", "REASON"):
        table.add_column(col)
    for j in jobs:
        r = j.record
        table.add_row(
            r.id,
            r.name,
            r.tenant,
            _state_markup(r.state.value),
            f"{r.step if r.step is not None else '-'}/{r.total_steps}",
            timestamp(r.created_at),
            r.reason[:60],
        )
    console.print(table)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    with rest_client(args) as client:
        job = client.job(args.job_id)
    if args.json:
        print(job.record.model_dump_json(indent=2))
    else:
        _print_record(job, _console())
    return EXIT_OK


def _print_log_page(job, since: int) -> tuple[int, bool]:
    """Print the log lines after cursor `since`; returns the next cursor and whether there were any."""
    page = job.logs(since)
    for line in page.lines:
        print(f"{timestamp(line.time)} [{line.level}] {line.message}", flush=True)
    return page.next, bool(page.lines)


def cmd_logs(args: argparse.Namespace) -> int:
    with rest_client(args) as client:
        job = client.job(args.job_id)
        if args.driver:
            print(job.driver_log(), end="")
            return EXIT_OK
        since, ended = 0, False
        while True:
            since, more = _print_log_page(job, since)
            if more:
                continue  # read on at once: a page holds at most 1000 lines
            if ended or not args.follow:
                return EXIT_OK
            ended = job.refresh().done  # once ended, one more read: lines stored just before the end
            if not ended:
                time.sleep(1.0)


def cmd_metrics(args: argparse.Namespace) -> int:
    with rest_client(args) as client:
        points = client.job(args.job_id).metrics(since_step=args.since_step)
    if args.json:
        print(json.dumps([p.model_dump(mode="json") for p in points], indent=2))
        return EXIT_OK
    for p in points:
        print(f"attempt {p.attempt} step {p.step:>6}  " + _metrics_text(p.metrics, 8))
    return EXIT_OK


def cmd_checkpoints(args: argparse.Namespace) -> int:
    with rest_client(args) as client:
        for c in client.job(args.job_id).checkpoints():
            seen = {True: "", False: "  (missing)", None: ""}[c.exists]
            print(f"attempt {c.attempt} step {c.step:>6}  {c.path}{seen}")
    return EXIT_OK


def _printable(text: str) -> str:
    """Model output shown on a terminal: control characters (escape sequences) as visible escapes."""
    return "".join(c if c.isprintable() or c in "\n\t" else repr(c)[1:-1] for c in text)


def cmd_samples(args: argparse.Namespace) -> int:
    console = _console()
    with rest_client(args) as client:
        job = client.job(args.job_id)
        step = args.step if args.step is not None else job.samples(limit=1).last_step
        selected = "worst" if args.worst else None
        page = job.samples(step=step, selected=selected, limit=args.limit) if step is not None else None
    if args.json:
        print(page.model_dump_json(indent=2) if page else "null")
        return EXIT_OK
    if page is None or not page.samples:
        console.print(f"{job.id}: no samples" + (f" at step {step}" if step is not None else " yet"))
        return EXIT_OK
    for r in page.samples:
        adv = f"{r.advantage:+.3f}" if r.advantage is not None else "-"
        reward = f"{r.reward:.3f}" if r.reward is not None else "nan"
        console.print(
            f"[bold]step {r.step} group {r.group} #{r.index}[/bold]  reward {reward}  advantage {adv}  "
            f"{r.length} tokens ({r.finish_reason})  policy v{r.policy_version}  [dim]{', '.join(r.selected)}"
            + ("  (cut)" if r.truncated else "")
            + "[/dim]"
        )
        if r.status != "ok" or r.detail:
            console.print(f"  verdict  {r.status}: {_printable(r.detail)}", markup=False)
        console.print(
            "  prompt   " + _printable(r.prompt).replace("\n", "\n           "), markup=False, style="dim"
        )
        console.print("  response " + _printable(r.response).replace("\n", "\n           "), markup=False)
    if page.next_cursor:
        console.print(f"[dim]... more at step {step}: --limit {args.limit * 2}[/dim]")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    console = _console()
    with rest_client(args) as client:
        job = client.job(args.job_id).cancel(args.reason)
        console.print(
            f"{job.id}: {_state_markup(job.state.value)}"
            + ("" if job.done else " (cancel requested; it stops at the next step boundary)")
        )
        if args.wait and not job.done:
            job.wait()
            console.print(f"{job.id}: {_state_markup(job.state.value)} — {job.reason}")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    console = _console()
    with rest_client(args) as client:
        job = client.job(args.job_id).resume(args.checkpoint)
        console.print(
            f"{job.id}: attempt {job.record.attempt} {_state_markup(job.state.value)} "
            f"from {job.record.resume_from}"
        )
        return follow_job(job, console) if args.follow else EXIT_OK


# -- parser ---------------------------------------------------------------------------------------
