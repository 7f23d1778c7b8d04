"""Control-plane throughput and latency on loopback: requests/s, p50 and p99 under concurrent load.

Measured in one run, side by side:
- `GET /v1/jobs` (a page of 50 records with their transitions, SQLite) against `GET /healthz` (the
  framework's floor: routing + auth-free JSON),
- `POST /v1/jobs?dry_run=true` (full spec validation + server policy, nothing stored) against a stored
  `POST /v1/jobs` (validation + a write transaction with its transition and event rows),
each at several client concurrencies. The server runs in its own process (`tgc serve`, uvicorn, one
worker); the load comes from asyncio clients in this process, one connection per client.

    .venv/bin/python benchmarks/control_plane.py [--requests 400] [--concurrency 1 8 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from tgc_rl.control.local import LocalControlPlane

SPEC = {
    "name": "bench",
    "steps": 10,
    "group_size": 4,
    "prompts_per_step": 4,
    "model": {"source": "random", "config_overrides": {"num_hidden_layers": 2, "hidden_size": 64}},
}


async def _load(url: str, token: str, method: str, path: str, body: dict | None, n: int, concurrency: int):
    """Send `n` requests with `concurrency` clients; returns (wall seconds, latencies, non-2xx count)."""
    latencies: list[float] = []
    errors = 0
    remaining = n
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)

    async def client() -> None:
        nonlocal remaining, errors
        async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as c:
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                r = await c.request(method, path, json=body)
                latencies.append(time.perf_counter() - t0)
                errors += not r.is_success

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - start, latencies, errors


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400, help="requests per cell")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seed-jobs", type=int, default=200, help="jobs stored before measuring")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cp = LocalControlPlane(Path(tmp), ray_address="none", args=("--log-level", "warning"))
        token = cp.create_token("bench")
        with cp:
            with httpx.Client(base_url=cp.url, headers={"Authorization": f"Bearer {token}"}) as c:
                for i in range(args.seed_jobs):
                    c.post("/v1/jobs", json={**SPEC, "name": f"seed-{i}"}).raise_for_status()
            cases = [
                ("GET /healthz (floor)", "GET", "/healthz", None),
                ("GET /v1/jobs (50/page)", "GET", "/v1/jobs", None),
                ("POST /v1/jobs dry run", "POST", "/v1/jobs?dry_run=true", SPEC),
                ("POST /v1/jobs stored", "POST", "/v1/jobs", SPEC),
            ]
            print(
                f"control plane on loopback, {os.cpu_count()} CPUs, {args.requests} requests per cell, "
                f"{args.seed_jobs} jobs stored beforehand\n"
            )
            print(f"{'request':<26}{'clients':>8}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
            for label, method, path, body in cases:
                for conc in args.concurrency:
                    asyncio.run(
                        _load(cp.url, token, method, path, body, min(50, args.requests), conc)
                    )  # warm-up
                    wall, lat, errors = asyncio.run(
                        _load(cp.url, token, method, path, body, args.requests, conc)
                    )
                    print(
                        f"{label:<26}{conc:>8}{len(lat) / wall:>10.0f}{_pct(lat, 50) * 1e3:>10.1f}"
                        f"{_pct(lat, 99) * 1e3:>10.1f}{errors:>8}"
                    )
                print()


if __name__ == "__main__":
    main()
