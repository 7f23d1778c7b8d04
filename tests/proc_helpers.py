"""Process helpers of the tests: is a process alive, what did a test leave behind, waiting, a local Ray."""

import os
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
    """True once `predicate()` is; False after `timeout` s (a bound for a failing test: generous, since a
    slower or busier machine takes longer and a passing test returns at once)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def wait_for(predicate, timeout: float, what: str, every: float = 0.5):
    """The predicate's first truthy value, polled every `every` s; TimeoutError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def local_ray(**init):
    """Generator for a fixture: a local Ray in this process, shut down after, unless one was already running
    (another module's or the session's), which is used and left as it is."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, **init)
    yield ray
    if started:
        ray.shutdown()


def descendants(pid: int) -> set[int]:
    """Live descendants of `pid` (from /proc), zombies excluded."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] != "Z":
            parents[int(entry)] = int(stat[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found
