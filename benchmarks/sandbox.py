"""Sandbox overhead per call: a trivial program in the bwrap sandbox vs a plain `subprocess.run` of it.

Target: under 50 ms added per call (the peer anchor is ~100 ms for SandboxFusion's isolation mode).
Also shows the unsafe_local mode (same rlimits via prlimit, no namespaces) to split the cost between the
rlimits/supervision and bwrap. Calls are interleaved so that load drifts hit every column alike; on a
shared, oversubscribed machine the minimum is the figure closest to the cost on an idle one.
    .venv/bin/python benchmarks/sandbox.py [--calls 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import warnings

from tgc_rl.sandbox import Sandbox

PROGRAM = "print('ok')"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args()
    box = Sandbox()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unsafe = Sandbox(mode="unsafe_local")
    py = box.python

    def plain() -> None:
        r = subprocess.run([py, "-I", "-S", "-B", "-c", PROGRAM], capture_output=True, check=True)
        assert r.stdout == b"ok\n"

    def sandboxed() -> None:
        assert box.run(PROGRAM).stdout == "ok\n"

    def unsafe_local() -> None:
        assert unsafe.run(PROGRAM).stdout == "ok\n"

    columns = {
        "plain subprocess.run": plain,
        "unsafe_local (no namespaces)": unsafe_local,
        "bwrap sandbox": sandboxed,
    }
    times: dict[str, list[float]] = {name: [] for name in columns}
    for fn in columns.values():  # warm the page cache
        fn()
    for _ in range(args.calls):
        for name, fn in columns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000)
    print(
        f"{args.calls} calls each of {PROGRAM!r} with {py}; load average {os.getloadavg()[0]:.2f}, "
        f"{os.cpu_count()} CPUs"
    )
    print(
        f"{'':<30}{'median ms':>10}{'p90 ms':>8}{'min ms':>8}{'added (median) ms':>19}{'added (min) ms':>16}"
    )
    base = statistics.median(times["plain subprocess.run"])
    base_min = min(times["plain subprocess.run"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(
            f"{name:<30}{med:>10.1f}{_pct(ts, 0.9):>8.1f}{min(ts):>8.1f}{med - base:>19.1f}"
            f"{min(ts) - base_min:>16.1f}"
        )
    added = statistics.median(times["bwrap sandbox"]) - base
    added_min = min(times["bwrap sandbox"]) - base_min
    print(
        f"sandbox overhead: {added:.1f} ms added per call at the median ({added_min:.1f} ms at the "
        f"minimum); target < 50 ms: {'met' if added < 50 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
