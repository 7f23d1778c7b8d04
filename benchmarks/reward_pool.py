"""Verifications per second through the RewardPool (2 workers) for math and for code, next to the same
verifications done serially in this process; then a burst of 1,000 requests: none lost, latency p50/p99.

    .venv/bin/python benchmarks/reward_pool.py [--workers 2] [--math 600] [--code 60] [--burst 1000]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import threading
import time

from tgc_rl.config import TaskSpec
from tgc_rl.reward import RewardPool
from tgc_rl.tasks import Score, TaskItem, load_task

# Math answers in the forms a model writes them, half right, half wrong.
_MATH = [
    ("\\frac{1}{2}", "so the probability is 0.5"),
    ("(x+1)^2", "$x^2 + 2x + 1$"),
    ("72", "#### 72"),
    ("1000", "The total is 1,000."),
    ("7", "\\boxed{8}"),
    ("\\frac{3}{4}", "It is 0.7."),
    ("12", "12 apples"),
    ("5", "I think it is 6"),
]


def math_batch(n: int) -> tuple[list[TaskItem], list[str]]:
    pairs = [_MATH[i % len(_MATH)] for i in range(n)]
    items = [TaskItem(id=f"m{i}", prompt="?", answer=a, kind="math") for i, (a, _) in enumerate(pairs)]
    return items, [r for _, r in pairs]


def code_batch(n: int) -> tuple[list[TaskItem], list[str]]:
    task = load_task("code", {"cases": 3}, 0)
    items = [task.item(i) for i in range(n)]
    responses = [
        f"```python\n{it.meta['reference']}```" if i % 2 else "```python\nprint(0)\n```"
        for i, it in enumerate(items)
    ]
    return items, responses


def serial(task_name: str, params: dict, items: list[TaskItem], responses: list[str]) -> float:
    """The alternative: one process verifying one sample after another (math-verify / sandbox in-process)."""
    from tgc_rl.reward.verifier import Verifier

    verifier = Verifier(task_name, params, 0)
    verifier.warm_up()
    start = time.perf_counter()
    for item, response in zip(items, responses, strict=True):
        verifier(item, response)
    return len(items) / (time.perf_counter() - start)


def pooled(spec: TaskSpec, items: list[TaskItem], responses: list[str]) -> tuple[float, collections.Counter]:
    with RewardPool(spec) as pool:
        pool.score(items[:4], responses[:4])  # workers warm
        start = time.perf_counter()
        scores = pool.score(items, responses)
        rate = len(items) / (time.perf_counter() - start)
    return rate, collections.Counter(s.status for s in scores)


def burst(spec: TaskSpec, n: int) -> None:
    items, responses = math_batch(n)
    done_at: dict[int, float] = {}
    lock = threading.Lock()
    with RewardPool(spec) as pool:
        pool.score(items[:4], responses[:4])
        start = time.perf_counter()
        futures = []
        for i, (item, response) in enumerate(zip(items, responses, strict=True)):
            f = pool.submit(item, response)
            f.add_done_callback(
                lambda _, i=i: (lock.acquire(), done_at.__setitem__(i, time.perf_counter()), lock.release())
            )
            futures.append(f)
        scores: list[Score] = [f.result() for f in futures]
        wall = time.perf_counter() - start
        stats = pool.stats()
    latencies = sorted(done_at[i] - start for i in range(n))
    statuses = collections.Counter(s.status for s in scores)
    print(f"\nburst of {n} requests submitted at once ({spec.reward_workers} workers):")
    print(f"  answered {len(scores)}/{n} (lost: {n - len(scores)}), statuses {dict(statuses)}")
    print(
        f"  end-to-end latency p50 {statistics.median(latencies) * 1000:.0f} ms, "
        f"p99 {latencies[int(0.99 * (n - 1))] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms; "
        f"drained in {wall:.2f} s ({n / wall:.0f}/s)"
    )
    print(
        f"  per-verification latency in the workers p50 {stats['reward/latency_p50_s'] * 1000:.1f} ms, "
        f"p99 {stats['reward/latency_p99_s'] * 1000:.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--math", type=int, default=600)
    ap.add_argument("--code", type=int, default=60)
    ap.add_argument("--burst", type=int, default=1000)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    print(f"{'verifications/s':<28}{'serial, in-process':>20}{f'pool, {args.workers} workers':>20}  statuses")
    math_spec = TaskSpec(name="arithmetic", reward_workers=args.workers, reward_timeout_s=10)
    items, responses = math_batch(args.math)
    one = serial("arithmetic", {}, items, responses)
    rate, statuses = pooled(math_spec, items, responses)
    print(f"{'math (math-verify)':<28}{one:>20.0f}{rate:>20.0f}  {dict(statuses)}")
    code_spec = TaskSpec(name="code", params={"cases": 3}, reward_workers=args.workers, reward_timeout_s=30)
    items, responses = code_batch(args.code)
    one = serial("code", {"cases": 3}, items, responses)
    rate, statuses = pooled(code_spec, items, responses)
    print(f"{'code (bwrap, 1-3 runs each)':<28}{one:>20.1f}{rate:>20.1f}  {dict(statuses)}")
    burst(math_spec, args.burst)


if __name__ == "__main__":
    main()
