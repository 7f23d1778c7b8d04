"""The learner against the hardware: shared-prompt vs full forward side by side, and FLOP/s vs this CPU's GEMM peak.

In one process, on SmolLM2-135M: (1) the GEMM peak, a 2048^3 matmul in the compute dtype (bf16 where the CPU
has AVX512-BF16/AMX, else float32) on the same threads; (2) learner steps (tgc_rl.learner.Learner, 1 rank)
with `optim.shared_prompt_forward` off and on, alternating on the same batches, at the default job's shapes
(8 prompts x 8 responses, ~43 prompt and ~12 response tokens) and with 4x longer prompts; (3) what bounds
it: the time the step's GEMMs take at the rate a GEMM of the step's own shapes reaches here, vs the step.

Model FLOPs count what the model needs (causal attention over real tokens only, the head on response tokens),
forward + backward = 3x forward; "full-forward equivalent" FLOP/s credits the shared-prompt step with the
work of the full forward it replaces.

    .venv/bin/python benchmarks/learner_flops.py --steps 2              # 1 thread, CPU clock
    .venv/bin/python benchmarks/learner_flops.py --threads 2 --wall     # as the default job runs, wall clock
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learner import make_batch, make_spec  # noqa: E402  (benchmarks/learner.py)

# This process's CPU seconds by default: on a shared machine the wall clock counts the time others hold the
# cores, the CPU clock only the work done here (with 1 thread: no OpenMP spin-waits counted either).
CLOCK = time.process_time


def gemm_peak(dtype: torch.dtype, n: int = 2048) -> float:
    """Median FLOP/s of an n x n x n matmul in `dtype` on the current threads."""
    return matmul_rate(n, n, n, dtype, repeats=7)


def step_work(cfg, batch, micro_batch_size: int, shared: bool) -> dict[str, int]:
    """What one learner step on `batch` computes, as the learner's plan cuts it: tokens through the decoder,
    causal query-key pairs, rows through the head, and the model FLOPs (forward + backward)."""
    from tgc_rl.learner.plan import MicroBatchLimit, group_spans, plan_minibatches, trim_padding
    from tgc_rl.learner.prefix_tree import pack_trees

    tokens = pairs = head_rows = 0
    limit = MicroBatchLimit(micro_batch_size, tree=shared)
    for rows in plan_minibatches(group_spans(batch), 1, 1, limit)[0].for_rank(0):
        m = trim_padding(batch.select(rows))
        trees = pack_trees(m.input_ids, m.attention_mask, m.prompt_len, m.response_mask) if shared else None
        if trees is None:
            n = m.attention_mask.sum(1)
            tokens += int(n.sum())
            pairs += int((n * (n + 1) // 2).sum())
            head_rows += int(m.response_mask.sum())
        else:
            tokens += trees.nodes
            # a node attends to itself and its ancestors: position + 1 keys; padding nodes (position 0) only itself
            pairs += int((trees.position_ids + 1).sum()) - (trees.input_ids.numel() - trees.nodes)
            head_rows += int(torch.unique(trees.source).numel())
    H, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    kv = cfg.num_key_value_heads * (H // cfg.num_attention_heads)
    linear_params = L * (2 * H * H + 2 * H * kv + 3 * H * cfg.intermediate_size)
    # backward = 2x forward; the chunked head recomputes its logits in backward (2VH a row more)
    gemm = 6 * linear_params * tokens + 8 * V * H * head_rows
    return {
        "tokens": tokens,
        "head_rows": head_rows,
        "gemm_flops": gemm,
        "flops": gemm + 3 * 4 * H * pairs * L,
    }


def matmul_rate(m: int, k: int, n: int, dtype: torch.dtype, repeats: int = 5) -> float:
    """Median FLOP/s of an (m x k) @ (k x n) matmul: the GEMM rate at one of the step's own shapes."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = CLOCK()
        a @ b
        times.append(CLOCK() - t0)
    return 2 * m * k * n / statistics.median(times)


def gemm_floor(cfg, work: dict[str, int], micro_batches: int, dtype: torch.dtype) -> float:
    """Seconds the step's GEMMs take at the rate GEMMs of its shapes reach here (the MLP's up-projection for
    the decoder, one head chunk for the head): the step's time if everything else were free."""
    H, V = cfg.hidden_size, cfg.vocab_size
    m = max(1, work["tokens"] // micro_batches)
    head = 8 * V * H * work["head_rows"]
    return (work["gemm_flops"] - head) / matmul_rate(m, H, cfg.intermediate_size, dtype) + head / matmul_rate(
        min(1024, max(1, work["head_rows"] // micro_batches)), H, V, dtype
    )


def run_shape(args, name: str, prompt: int, peak: float, path) -> list[str]:
    from tgc_rl.learner import Learner, LearnerSpec
    from tgc_rl.learner.plan import group_spans, plan_minibatches

    shape = argparse.Namespace(
        model="smollm2",
        dtype=args.dtype,
        groups=8,
        group_size=8,
        prompt=prompt,
        response=args.response,
        micro_batch_size=16,
    )
    batches = [make_batch(shape, seed=s) for s in range(args.steps + 1)]
    learners = {}
    for shared in (False, True):
        spec = make_spec(
            shape,
            optim={
                "lr": 1e-6,
                "micro_batch_size": 16,
                "logprob_chunk_tokens": 1024,
                "shared_prompt_forward": shared,
            },
        )
        learners[shared] = Learner(LearnerSpec.of(spec), path)
    cfg = learners[False].policy.lm.config
    times: dict[bool, list[float]] = {False: [], True: []}
    for i, b in enumerate(batches):
        for shared in (False, True) if i % 2 == 0 else (True, False):  # alternate who goes first
            t0 = CLOCK()
            learners[shared].train_step(b)
            if i:
                times[shared].append(CLOCK() - t0)
        print(
            f"  {name} step {i}: full {times[False][-1] if i else 0:.2f} s, shared "
            f"{times[True][-1] if i else 0:.2f} s{' (warm-up)' if i == 0 else ''}",
            flush=True,
        )
    b = batches[1]
    row_tokens = int(b.attention_mask.sum())
    lines = [
        f"\n## {name}: 8 x 8 rows, {row_tokens} tokens a step ({int(b.response_mask.sum())} response), "
        f"micro-batch 16, {args.steps} steps"
    ]
    lines.append(
        f"{'forward':10s} {'median s':>9s} {'speedup':>8s} {'computed tok':>13s} {'step GFLOP':>12s} "
        f"{'GFLOP/s':>8s} {'util':>6s} {'full-equiv GFLOP/s':>19s}"
    )
    timed = batches[1:]
    work = {shared: [step_work(cfg, x, 16, shared) for x in timed] for shared in (False, True)}
    med = {s: statistics.median(t) for s, t in times.items()}
    full_flops = sum(w["flops"] for w in work[False])
    for shared in (False, True):
        flops, secs = sum(w["flops"] for w in work[shared]), sum(times[shared])
        rate = flops / secs
        lines.append(
            f"{'shared' if shared else 'full':10s} {med[shared]:9.2f} {med[False] / med[shared]:8.2f} "
            f"{work[shared][0]['tokens']:13d} {work[shared][0]['flops'] / 1e9:12.1f} {rate / 1e9:8.1f} "
            f"{rate / peak:6.1%} {full_flops / secs / 1e9:19.1f}"
        )
    n_micro = len(plan_minibatches(group_spans(b), 1, 1, learners[False].micro_limit)[0].for_rank(0))
    dtype = learners[False].compute_dtype
    for shared in (False, True):
        w = work[shared][0]
        floor = gemm_floor(cfg, w, n_micro, dtype)
        lines.append(
            f"{'shared' if shared else 'full'}: its GEMMs ({w['gemm_flops'] / w['flops']:.0%} of its FLOPs) "
            f"at the rate GEMMs of its shapes reach here take {floor:.2f} s = {floor / times[shared][0]:.0%} "
            f"of its step; the rest is attention, norms, element-wise ops, copies and the optimizer"
        )
    for learner in learners.values():
        learner.close()
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (the default job's learner has 2 here; 1 keeps the CPU clock free of spin-waits)",
    )
    p.add_argument(
        "--wall", action="store_true", help="time with the wall clock instead of this process's CPU clock"
    )
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant (after one warm-up)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument(
        "--prompt", type=int, default=58, help="max prompt tokens (uniform from half of it): mean ~43"
    )
    p.add_argument("--response", type=int, default=16, help="max response tokens (uniform from half of it)")
    p.add_argument("--prompt-scales", type=int, nargs="+", default=[1, 4])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter

    from tgc_rl.learner.sharding import compute_dtype
    from tgc_rl.models import model_dir

    dtype = compute_dtype(args.dtype, torch.device("cpu"))
    path = model_dir(
        make_spec(
            argparse.Namespace(
                model="smollm2",
                dtype=args.dtype,
                group_size=8,
                groups=8,
                response=args.response,
                micro_batch_size=16,
            )
        ).model,
        0,
    )
    peak = gemm_peak(dtype)
    flags = [f for f in ("avx512_bf16", "amx_bf16") if f in open("/proc/cpuinfo").read()]
    out = [
        f"# learner vs hardware: SmolLM2-135M, compute {str(dtype).removeprefix('torch.')}, "
        f"{args.threads} threads, {'wall' if args.wall else 'CPU'} clock, CPU flags {flags or 'no native bf16'}, load average {os.getloadavg()[0]:.1f}",
        f"GEMM peak (2048^3 {str(dtype).removeprefix('torch.')} matmul, median of 7): {peak / 1e9:.0f} GFLOP/s",
    ]
    print("\n".join(out), flush=True)
    for scale in args.prompt_scales:
        name = "default job's shapes" if scale == 1 else f"{scale}x longer prompts"
        out += run_shape(args, name, args.prompt * scale, peak, path)
    out.append(
        f"GEMM peak again at the end: {gemm_peak(dtype) / 1e9:.0f} GFLOP/s; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print("\n".join(out))


if __name__ == "__main__":
    main()
