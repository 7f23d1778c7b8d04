"""Loss + backward of every rlcore preset against a plain hand-written GRPO loss, and the diagnostics' cost.

    .venv/bin/python benchmarks/objectives.py                      # B=256, T=2048, all presets
    .venv/bin/python benchmarks/objectives.py --presets grpo,cp_grpo --repeats 31

Shapes are (B, T) float32 with responses of random length T/4..T. Every candidate gets the same
inputs; rounds are interleaved (each round runs every candidate once) and the median is reported, in
thread CPU time by default (`--clock wall` for wall time), so other load on a shared machine distorts
the comparison as little as possible. Peak memory is the high-water mark of tensor memory allocated
during one loss + backward (torch profiler, inputs excluded). Diagnostics are timed apart: D1-D11
with all optional inputs, and the core families alone (D1, D2, D3, D4, D11).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import profile

import rlcore
from rlcore.diagnostics import _token_sums_cpu, _token_sums_torch, ascent_weights, cancellation_diagnostics


def plain_grpo(lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """What one writes by hand: token ratio, PPO clip 0.2, mean over each response, mean over responses."""
    ratio = torch.exp(lp - old)
    a = adv[:, None]
    per_token = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 0.8, 1.2))
    return ((per_token * mask).sum(1) / mask.sum(1)).mean()


def make_inputs(batch: int, width: int, group_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=g) * 3
    lengths = torch.randint(width // 4, width + 1, (batch,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    group_ids = torch.arange(batch) // group_size
    tokens = torch.randint(0, 32_000, (batch, width), generator=g)
    first = (torch.arange(batch) // group_size) * group_size
    tokens[:, :16] = tokens[first, :16]  # a 16-token group-common opening, as in real rollouts
    old[:, :16] = old[first, :16]
    return dict(
        old=old,
        logprobs=old + 0.05 * torch.randn(batch, width, generator=g),
        mask=mask,
        group_ids=group_ids,
        tokens=tokens,
        rewards=(torch.rand(batch, generator=g) < 0.5).float(),
        entropies=torch.rand(batch, width, generator=g) * 2,
    )


def peak_mib(fn: Callable[[], None]) -> float:
    """High-water mark of memory allocated (net of frees) while fn runs, in MiB."""
    with profile(profile_memory=True) as prof:
        fn()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak / 2**20


def interleaved_medians(
    jobs: dict[str, Callable[[], Callable[[], None]]], repeats: int, clock
) -> dict[str, float]:
    """jobs: name -> setup() returning the timed callable (setup itself is not timed). Median ms."""
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(repeats):
        for name, setup in jobs.items():
            run = setup()
            t0 = clock()
            run()
            times[name].append((clock() - t0) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--presets", default="all", help="comma-separated preset names, or 'all'")
    parser.add_argument("--clock", choices=["thread", "wall"], default="thread")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    names = rlcore.list_objectives() if args.presets == "all" else args.presets.split(",")
    x = make_inputs(args.batch, args.width, args.group_size)
    old, mask, gids = x["old"], x["mask"], x["group_ids"]
    objectives = {n: rlcore.get_objective(n) for n in names}
    advs = {n: o.advantages(x["rewards"], gids, mask) for n, o in objectives.items()}
    plain_adv = advs.get("grpo", rlcore.get_objective("grpo").advantages(x["rewards"], gids, mask))

    def leaf() -> torch.Tensor:
        return x["logprobs"].clone().requires_grad_(True)

    def loss_job(name: str) -> Callable[[], Callable[[], None]]:
        if name == "plain GRPO":

            def setup():
                lp = leaf()
                return lambda: plain_grpo(lp, old, plain_adv, mask).backward()
        else:
            obj, adv = objectives[name], advs[name]

            def setup():
                lp = leaf()
                return lambda: obj.loss(lp, old, adv, mask, gids).loss.backward()

        return setup

    candidates = ["plain GRPO", *names]
    loss_ms = interleaved_medians({n: loss_job(n) for n in candidates}, args.repeats, clock)
    memory = {n: peak_mib(loss_job(n)()) for n in candidates}

    weights = {}
    for n in names:
        w, out = ascent_weights(objectives[n], x["logprobs"], old, advs[n], mask, gids)
        weights[n] = (w, out.clipped)

    def diag_job(name: str, full: bool) -> Callable[[], Callable[[], None]]:
        w, clipped = weights[name]
        extra = dict(old_logprobs=old, entropies=x["entropies"], clipped=clipped) if full else {}
        return lambda: lambda: cancellation_diagnostics(w, x["tokens"], mask, gids, advs[name], **extra)

    diag_jobs = {(n, full): diag_job(n, full) for n in names for full in (True, False)}
    diag_ms = interleaved_medians(diag_jobs, args.repeats, clock)

    base = loss_ms["plain GRPO"]
    print(
        f"B={args.batch} T={args.width} G={args.group_size} float32, threads={args.threads}, "
        f"median of {args.repeats} interleaved rounds, {args.clock} clock"
    )
    print(
        f"{'objective':24s} {'loss+bwd ms':>11s} {'vs plain':>8s} {'peak MiB':>9s} {'vs plain':>8s} "
        f"{'diag ms':>8s} {'/own':>6s} {'/plain':>6s} {'core ms':>8s} {'/own':>6s} {'/plain':>6s}  cancels"
    )
    print(f"{'plain GRPO':24s} {base:11.2f} {1.0:7.2f}x {memory['plain GRPO']:9.1f} {1.0:7.2f}x")
    for n in names:
        full, core = diag_ms[(n, True)], diag_ms[(n, False)]
        print(
            f"{n:24s} {loss_ms[n]:11.2f} {loss_ms[n] / base:7.2f}x {memory[n]:9.1f} "
            f"{memory[n] / memory['plain GRPO']:7.2f}x {full:8.2f} {full / loss_ms[n]:6.1%} {full / base:6.1%} "
            f"{core:8.2f} {core / loss_ms[n]:6.1%} {core / base:6.1%}  {objectives[n].preserves_cancellation}"
        )
    print(
        "diag: D1-D11 with old_logprobs, entropies and clipped; core: D1, D2, D3, D4, D11; added time relative to "
        "the preset's own loss + backward (/own) and to the plain GRPO loss + backward (/plain)"
    )

    # The diagnostics' pass over (B, T): the compiled CPU loop against the torch ops other devices run.
    w, clipped = weights[names[0]]
    stage1 = {
        path.__name__: (lambda f=path: lambda: f(w, mask, None, x["entropies"], clipped, old))
        for path in (_token_sums_cpu, _token_sums_torch)
    }
    s1 = interleaved_medians(stage1, args.repeats, clock)
    print(
        f"stage 1 of the diagnostics (one pass over B x T, {names[0]}'s weights, all inputs): compiled CPU loop "
        f"{s1['_token_sums_cpu']:.2f} ms, torch ops (the path of other devices) {s1['_token_sums_torch']:.2f} ms"
    )


if __name__ == "__main__":
    main()
