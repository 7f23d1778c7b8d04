"""Run one untrusted program in the sandbox: deadline, output caps, and a result that says what happened.

`Sandbox.run(code)` starts bwrap (see `bwrap.py`) running `prlimit <rlimits> -- python main.py` (or the
Python launcher, `launcher.py`, when files are to be fetched back), feeds stdin from a memfd, reads
stdout/stderr up to a cap, and kills the whole run when the wall-clock deadline passes or an output cap
is exceeded: SIGKILL to the sandbox's pid-namespace init makes the kernel kill every process inside,
daemons included, and bwrap reaps it.

`mode="unsafe_local"` runs the same command as a plain child process (rlimits, clean env, temp dir,
process-group kill) without namespaces. It is for trusted code only and says so loudly.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from tgc_rl.sandbox import bwrap as bw
from tgc_rl.sandbox import metrics
from tgc_rl.sandbox.limits import SandboxLimits

log = logging.getLogger(__name__)

SandboxMode = Literal["bwrap", "unsafe_local"]
LANGUAGES = ("python", "bash")
_LAUNCHER = (Path(__file__).parent / "launcher.py").read_text()
# util-linux prlimit sets the rlimits and execs the program: no launcher interpreter to start per run.
_PRLIMIT = next((p for p in ("/usr/bin/prlimit",) if os.access(p, os.X_OK)), None)
_PRLIMIT_FLAGS = {
    "RLIMIT_CPU": "--cpu",
    "RLIMIT_AS": "--as",
    "RLIMIT_NPROC": "--nproc",
    "RLIMIT_FSIZE": "--fsize",
    "RLIMIT_NOFILE": "--nofile",
    "RLIMIT_CORE": "--core",
}
_READ_CHUNK = 1 << 16
_EXIT_GRACE_S = 0.5  # after the program exits, how long stray holders of its pipes may keep them open
_UNSAFE_WARNING = (
    "UNSAFE: sandbox mode 'unsafe_local' runs programs WITHOUT isolation (no namespaces: they can read "
    "your files, use the network and signal your processes). Use it for trusted code only."
)


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): bwrap could not set up, the launcher could not start."""


@dataclass(frozen=True)
class RunResult:
    """What one run did. `status`: finished | timeout | output_limit (the run was killed for the last two)."""

    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False
    output_exceeded: bool = False
    isolation: SandboxMode = "bwrap"
    files: dict[str, str] = field(default_factory=dict)  # fetched files, base64

    @property
    def status(self) -> Literal["finished", "timeout", "output_limit"]:
        if self.timed_out:
            return "timeout"
        if self.output_exceeded:
            return "output_limit"
        return "finished"

    @property
    def signal(self) -> int | None:
        """The signal that ended the program (bwrap reports it as 128 + signal number)."""
        if self.exit_code is not None and self.exit_code > 128:
            return self.exit_code - 128
        return None

    @property
    def ok(self) -> bool:
        return self.status == "finished" and self.exit_code == 0


class Sandbox:
    """Runs untrusted programs under bwrap with rlimits and a wall-clock deadline. Thread-safe."""

    def __init__(
        self, limits: SandboxLimits | None = None, mode: SandboxMode = "bwrap", python: str | None = None
    ):
        if mode not in ("bwrap", "unsafe_local"):
            raise ValueError(
                f"sandbox mode {mode!r}: use 'bwrap' (default) or 'unsafe_local' (trusted code only)"
            )
        self.limits = limits or SandboxLimits()
        self.mode: SandboxMode = mode
        self.python = bw.find_python(python, unprivileged=mode == "bwrap" and bw.host_uid() is not None)
        if mode == "unsafe_local":
            warnings.warn(_UNSAFE_WARNING, RuntimeWarning, stacklevel=2)
            log.warning(_UNSAFE_WARNING)
            self._bwrap = ""
            self._uid = None
        else:
            self._bwrap = bw.find_bwrap()
            self._uid = bw.host_uid()
            _check_bwrap_works(self)

    # -- public --------------------------------------------------------------------------------------
    def run(
        self,
        code: str,
        *,
        language: str = "python",
        stdin: str | bytes | None = None,
        files: dict[str, bytes] | None = None,
        fetch: list[str] | tuple[str, ...] = (),
        limits: SandboxLimits | None = None,
    ) -> RunResult:
        """Run `code` as a program of `language` with `stdin`; `files` (relative paths) are put in the
        work dir first and `fetch` (relative paths) are read back after the program ends."""
        if language not in LANGUAGES:
            raise ValueError(f"language {language!r} is not supported; use one of {', '.join(LANGUAGES)}")
        limits = limits or self.limits
        main = "main.py" if language == "python" else "main.sh"
        program = {main: code.encode()}
        for name, data in (files or {}).items():
            program[_relative(name, "files")] = data
        fetch_paths = [_relative(p, "fetch_files") for p in fetch]
        run = self._run_unsafe if self.mode == "unsafe_local" else self._run_bwrap
        start = time.monotonic()
        try:
            result = run(language, main, program, stdin, fetch_paths, limits)
        except SandboxError:
            metrics.SANDBOX_RUNS.labels("error").inc()
            raise
        metrics.SANDBOX_RUNS.labels(result.status).inc()
        metrics.SANDBOX_SECONDS.observe(time.monotonic() - start)
        return result

    def _command(
        self,
        language: str,
        main: str,
        workdir: str,
        limits: SandboxLimits,
        fetch: list[str],
        fetch_fd: int | None,
        nproc: bool = True,
    ) -> list[str]:
        """What runs in the sandbox: `prlimit <rlimits> -- <program>`, or the Python launcher where files
        must be fetched after the program (or prlimit is missing)."""
        rlimits = limits.rlimits()
        if not nproc:  # unsafe_local: RLIMIT_NPROC would count every process of the host user
            rlimits.pop("RLIMIT_NPROC")
        if fetch_fd is None and _PRLIMIT is not None:
            program = [self.python, "-E", "-s", "-S", "-B", main] if language == "python" else [_bash(), main]
            flags = [f"{_PRLIMIT_FLAGS[name]}={soft}:{hard}" for name, (soft, hard) in rlimits.items()]
            return [_PRLIMIT, *flags, "--", *program]
        spec = ",".join(f"{name}={soft}:{hard}" for name, (soft, hard) in rlimits.items())
        fetch_spec = ""
        if fetch_fd is not None:
            fetch_spec = f"{fetch_fd}:{limits.max_output_bytes}:" + "\n".join(fetch)
        launch = (
            ["runpy", workdir, spec, fetch_spec, main]
            if language == "python"
            else ["exec", workdir, spec, fetch_spec, _bash(), main]
        )
        return [self.python, "-I", "-S", "-B", "-c", _LAUNCHER, *launch]

    # -- bwrap ---------------------------------------------------------------------------------------
    def _run_bwrap(
        self,
        language: str,
        main: str,
        program: dict[str, bytes],
        stdin: str | bytes | None,
        fetch: list[str],
        limits: SandboxLimits,
    ) -> RunResult:
        fds: list[int] = []
        try:
            files = []
            for rel, data in program.items():
                fds.append(_memfd(rel, data))
                files.append((fds[-1], f"{bw.WORKDIR}/{rel}"))
            stdin_fd = _memfd("stdin", _as_bytes(stdin))
            fds.append(stdin_fd)
            seccomp_fd = _memfd("seccomp", bw.seccomp_program())
            fds.append(seccomp_fd)
            status_r, status_w = os.pipe()
            fds.append(status_r)
            fetch_r = fetch_w = None
            if fetch:
                fetch_r, fetch_w = os.pipe()
                fds.append(fetch_r)
            command = self._command(
                language,
                f"{bw.WORKDIR}/{main}",
                bw.WORKDIR,
                limits,
                [f"{bw.WORKDIR}/{p}" for p in fetch],
                fetch_w,
            )
            argv = [*bw.bwrap_argv(self._bwrap, self.python, limits, files, status_w, seccomp_fd), *command]
            keep = (
                *(fd for fd, _ in files),
                status_w,
                seccomp_fd,
                *((fetch_w,) if fetch_w is not None else ()),
            )
            outcome = _supervise(
                argv,
                stdin_fd,
                keep,
                limits,
                self._uid,
                cwd="/",
                extra_reads={"status": status_r, **({"fetch": fetch_r} if fetch_r else {})},
                close_after_start=[status_w, *([fetch_w] if fetch_w is not None else [])],
            )
        finally:
            for fd in fds:
                _close_quietly(fd)
        status = outcome.extra.get("status", b"")
        started, ended = b'"child-pid"' in status, b'"exit-code"' in status
        # bwrap reports the program's exit; without that report (and unkilled), bwrap itself failed, e.g. to
        # exec. A program cannot fake this by printing "bwrap:" lines: the status fd is out of its reach.
        killed = outcome.timed_out or outcome.output_exceeded
        if not started or (not ended and not killed and outcome.stderr.startswith(b"bwrap:")):
            raise SandboxError(
                f"bwrap failed to start the program (exit {outcome.exit_code}): "
                f"{outcome.stderr.decode(errors='replace').strip()[:2000]}"
            )
        return outcome.result("bwrap", _fetched(outcome.extra.get("fetch"), bw.WORKDIR))

    # -- unsafe_local ----------------------------------------------------------------------------------
    def _run_unsafe(
        self,
        language: str,
        main: str,
        program: dict[str, bytes],
        stdin: str | bytes | None,
        fetch: list[str],
        limits: SandboxLimits,
    ) -> RunResult:
        workdir = tempfile.mkdtemp(prefix="tgc-unsafe-sandbox-")
        fds: list[int] = []
        try:
            for rel, data in program.items():
                path = Path(workdir) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            stdin_fd = _memfd("stdin", _as_bytes(stdin))
            fds.append(stdin_fd)
            fetch_r = fetch_w = None
            if fetch:
                fetch_r, fetch_w = os.pipe()
                fds.append(fetch_r)
            # RLIMIT_NPROC would count every process of the host user here, so it is left out.
            argv = self._command(
                language,
                f"{workdir}/{main}",
                workdir,
                limits,
                [f"{workdir}/{p}" for p in fetch],
                fetch_w,
                nproc=False,
            )
            outcome = _supervise(
                argv,
                stdin_fd,
                (fetch_w,) if fetch_w is not None else (),
                limits,
                None,
                cwd=workdir,
                env={**bw.SANDBOX_ENV, "HOME": workdir, "TMPDIR": workdir},
                extra_reads={"fetch": fetch_r} if fetch_r else {},
                close_after_start=[fetch_w] if fetch_w is not None else [],
            )
        finally:
            for fd in fds:
                _close_quietly(fd)
            shutil.rmtree(workdir, ignore_errors=True)
        return outcome.result("unsafe_local", _fetched(outcome.extra.get("fetch"), workdir))


# -- process supervision ---------------------------------------------------------------------------------
@dataclass
class _Outcome:
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    wall_s: float
    timed_out: bool
    output_exceeded: bool
    extra: dict[str, bytes]

    def result(self, isolation: SandboxMode, files: dict[str, str]) -> RunResult:
        return RunResult(
            exit_code=self.exit_code,
            stdout=self.stdout.decode(errors="replace"),
            stderr=self.stderr.decode(errors="replace"),
            wall_s=self.wall_s,
            timed_out=self.timed_out,
            output_exceeded=self.output_exceeded,
            isolation=isolation,
            files=files,
        )


def _supervise(
    argv: list[str],
    stdin_fd: int,
    pass_fds: tuple[int, ...],
    limits: SandboxLimits,
    uid: int | None,
    *,
    cwd: str,
    extra_reads: dict[str, int],
    close_after_start: list[int],
    env: dict[str, str] | None = None,
) -> _Outcome:
    """Run argv to completion or kill it; `close_after_start` (write ends only the child keeps, so that
    EOF means it is gone) are closed here in every case."""
    start = time.monotonic()
    deadline = start + limits.wall_s
    user: dict = {}
    if uid is not None:
        prefix = bw.drop_privileges(uid)
        if prefix is not None:
            argv = [*prefix, *argv]
        else:
            user = {"user": uid, "group": uid, "extra_groups": []}
    try:
        proc = subprocess.Popen(
            argv,
            stdin=stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            start_new_session=True,
            cwd=cwd,
            env=env if env is not None else {"PATH": "/usr/bin:/bin"},
            **user,
        )
    finally:
        for fd in close_after_start:
            os.close(fd)
    bufs: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None  # both are PIPEs
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    for name, fd in extra_reads.items():
        bufs[name] = bytearray()
        sel.register(fd, selectors.EVENT_READ, name)
    timed_out = exceeded = False
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > _EXIT_GRACE_S:
                break
            wait = deadline - now if exited_at is None else min(deadline - now, _EXIT_GRACE_S)
            for key, _ in sel.select(timeout=min(wait, 0.25)):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.data]
                buf += chunk
                cap = limits.max_output_bytes
                if key.data in ("stdout", "stderr") and len(buf) > cap:
                    del buf[cap:]
                    exceeded = True
            if exceeded:
                break
    finally:
        sel.close()
        if timed_out or exceeded or proc.poll() is None:
            _kill_tree(proc, _child_pid(bufs.get("status")))
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    extra = {k: bytes(v) for k, v in bufs.items() if k not in ("stdout", "stderr")}
    return _Outcome(
        proc.returncode,
        bytes(bufs["stdout"]),
        bytes(bufs["stderr"]),
        time.monotonic() - start,
        timed_out,
        exceeded,
        extra,
    )


def _kill_tree(proc: subprocess.Popen, inner_pid: int | None) -> None:
    """Kill the sandbox's pid-namespace init first: the kernel then kills everything inside and bwrap
    reaps it (killing bwrap first would orphan the init to a host init that may never reap it)."""
    if inner_pid is not None and proc.poll() is None:  # bwrap alive: inner_pid is still its unreaped child
        try:
            os.kill(inner_pid, signal.SIGKILL)
            proc.wait(timeout=2.0)
            return
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def _child_pid(status: bytearray | None) -> int | None:
    """bwrap's `--json-status-fd` announces the host pid of the sandbox init as {"child-pid": N}."""
    if not status:
        return None
    try:
        return int(json.loads(bytes(status).split(b"\n", 1)[0])["child-pid"])
    except (ValueError, KeyError):
        return None


# -- helpers ------------------------------------------------------------------------------------------
def _bash() -> str:
    for path in ("/usr/bin/bash", "/bin/bash"):
        if os.path.exists(path):
            return path
    raise SandboxError("language 'bash' needs /usr/bin/bash on the host (apt-get install bash)")


def _relative(name: str, field_name: str) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts or name.endswith("/") or "\n" in name:
        raise ValueError(f"{field_name}: {name!r} must be a relative file path inside the work dir (no '..')")
    return str(p)


def _fetched(raw: bytes | None, workdir: str) -> dict[str, str]:
    if not raw:
        return {}
    try:
        files = json.loads(raw)
    except ValueError:
        return {}
    prefix = workdir.rstrip("/") + "/"
    return {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in files.items()}


def _as_bytes(data: str | bytes | None) -> bytes:
    if data is None:
        return b""
    return data.encode() if isinstance(data, str) else data


def _memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file: program text and stdin never touch the host's disk."""
    fd = os.memfd_create(f"tgc-sandbox-{name}", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _close_quietly(fd: int | None) -> None:
    if fd is None:
        return
    try:
        os.close(fd)
    except OSError:
        pass


_probe_lock = threading.Lock()
_probed: dict[tuple, None] = {}


def _check_bwrap_works(sandbox: Sandbox) -> None:
    """Run one trivial program once per (bwrap, python, uid); turn a failure into an actionable error."""
    key = (sandbox._bwrap, sandbox.python, sandbox._uid)
    with _probe_lock:
        if key in _probed:
            return
        if sandbox._uid is not None:
            bw.check_world_accessible(sandbox.python, "the sandbox interpreter")
            prefix = bw.python_prefix_bind(sandbox.python)
            if prefix:
                bw.check_world_accessible(prefix, "the sandbox interpreter's prefix")
        try:
            result = sandbox._run_bwrap(
                "python",
                "main.py",
                {"main.py": b"print('ok')"},
                None,
                [],
                sandbox.limits.replace(wall_s=30.0),
            )
        except SandboxError as e:
            raise bw.SandboxUnavailable(f"the code sandbox cannot run here: {e}. {bw.USERNS_HINT}") from None
        if not result.ok or result.stdout.strip() != "ok":
            raise bw.SandboxUnavailable(
                f"a trivial program failed in the sandbox (exit {result.exit_code}, status {result.status}): "
                f"{result.stderr.strip()[:2000]}. {bw.USERNS_HINT}"
            )
        _probed[key] = None
