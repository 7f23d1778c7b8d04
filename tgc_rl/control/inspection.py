"""Inspection of an uploaded file in a child process, never in the server's.

A tenant's file is untrusted input to C parsers (pyarrow) whose cost and failure modes the bounded reader
(tgc_rl/bounded_read.py) limits but cannot make impossible: a parser bug that recurses, crashes or
allocates must cost one child, not the control plane. So each inspection runs as `python -m
tgc_rl.control.inspection` with rlimits on address space and CPU time set before it reads a byte, a
wall-clock deadline, and at most `concurrency` children at once (an upload waits up to `queue_s` for a
slot; then `InspectorBusy`: the API answers 503 with Retry-After). The child answers one JSON line on stdout; a child that dies or runs out is
a refusal naming the limit, never a server error.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tgc_rl.bounded_read import DataError, DataLimits, TableShape

log = logging.getLogger(__name__)
_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the `tgc_rl` package
_REFUSED, _OUT_OF_MEMORY = 3, 4  # the child's exit codes besides 0 (stdout: the result or the reason)


class InspectorBusy(Exception):
    """Every inspection slot is taken; try again after `retry_after_s`."""

    def __init__(self, retry_after_s: int):
        super().__init__(f"every dataset inspection slot is busy; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class InspectionLimits:
    """What one inspection may cost: the child's rlimits and deadline, and how many run at once."""

    data: DataLimits = DataLimits()
    cpu_s: int = 30
    memory_mb: int = 1024
    concurrency: int = 2
    queue_s: float = 10.0  # how long an upload waits for a free slot

    @property
    def wall_s(self) -> float:
        return 2.0 * self.cpu_s + 10.0  # waiting for disk is not CPU; a stalled child is still stopped


class Inspector:
    def __init__(self, limits: InspectionLimits):
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.concurrency)

    @contextmanager
    def slot(self) -> Iterator[None]:
        """One of the `concurrency` inspection slots, waited for up to `queue_s`; InspectorBusy if none frees."""
        if not self._slots.acquire(timeout=self.limits.queue_s):
            raise InspectorBusy(retry_after_s=max(1, min(self.limits.cpu_s, 10)))
        try:
            yield
        finally:
            self._slots.release()

    def inspect(self, path: Path, fmt: str, label: str) -> TableShape:
        """The file's shape; DataError (naming row, column or the exhausted limit) if it is refused. Call it
        holding a `slot()`."""
        return self._run(path, fmt, label)

    def _run(self, path: Path, fmt: str, label: str) -> TableShape:
        lim = self.limits
        request = json.dumps(
            {
                "path": str(path),
                "format": fmt,
                "label": label,
                "limits": lim.data.to_json(),
                "cpu_s": lim.cpu_s,
                "memory_mb": lim.memory_mb,
            }
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "ARROW_DEFAULT_MEMORY_POOL": "system",  # jemalloc reserves address space the rlimit counts
            "MALLOC_ARENA_MAX": "2",
            "OMP_NUM_THREADS": "1",
        }
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "tgc_rl.control.inspection", request],
                cwd=_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=lim.wall_s,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            raise DataError(
                f"{label}: reading it took more than {lim.wall_s:.0f} s, this server's limit; split the file"
            ) from None
        answer = proc.stdout.decode("utf-8", "replace").strip()
        if proc.returncode == 0:
            shape = json.loads(answer)
            return TableShape(shape["rows"], shape["columns"], shape["decoded_bytes"])
        if proc.returncode == _REFUSED:
            raise DataError(answer[:4000])
        if proc.returncode == _OUT_OF_MEMORY:
            raise DataError(
                f"{label}: reading it needs more than {lim.memory_mb} MiB, this server's limit "
                "(dataset_inspect_memory_mb); split the file"
            )
        if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
            raise DataError(
                f"{label}: reading it needs more than {lim.cpu_s} s of CPU, this server's limit "
                "(dataset_inspect_cpu_s); split the file"
            )
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        log.warning(
            "dataset inspection of %s stopped (%s): %s",
            label,
            how,
            proc.stderr[-2000:].decode("utf-8", "replace"),
        )
        raise DataError(
            f"{label}: the reader stopped on this file ({how}) without reading it; check that it is a valid "
            f"{fmt.upper()} file, or split it"
        )


def _child(request: str) -> int:
    """In the child: limits first, then read; the answer on stdout, the outcome in the exit status."""
    import resource

    spec = json.loads(request)
    mib = 1 << 20
    resource.setrlimit(resource.RLIMIT_AS, (spec["memory_mb"] * mib, spec["memory_mb"] * mib))
    resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu_s"], spec["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # it writes no files
    try:
        from tgc_rl.bounded_read import inspect_file

        limits = DataLimits(**json.loads(spec["limits"]))
        shape = inspect_file(Path(spec["path"]), spec["format"], limits, spec["label"])
    except DataError as e:
        sys.stdout.write(str(e))
        return _REFUSED
    except MemoryError:
        return _OUT_OF_MEMORY
    except Exception as e:  # pyarrow's out-of-memory is an ArrowMemoryError
        if type(e).__name__ == "ArrowMemoryError":
            return _OUT_OF_MEMORY
        raise
    sys.stdout.write(
        json.dumps({"rows": shape.rows, "columns": shape.columns, "decoded_bytes": shape.decoded_bytes})
    )
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
