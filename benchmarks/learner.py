"""Learner benchmarks, printed side by side in one run.

1. Step throughput: tokens/s of the FSDP2 learner step (tgc_rl.learner.Learner, world size 1, gloo) vs a
   plain single-process torch loop (the same HF model unwrapped, same chunked log-prob head, same rlcore
   loss, same micro-batches, AdamW + clip_grad_norm_). With `optim.shared_prompt_forward` off the learner
   computes what the loop computes, so the ratio is the cost of FSDP2 and the learner's machinery (plan,
   normalisers, diagnostics, metrics); the default (shared prompts) is shown beside it. `--ranks 2` adds a
   2-rank LearnerGroup on Ray.
2. Peak memory of the log-prob head on N tokens with SmolLM2's vocabulary (49152): whole logits vs
   chunks, forward + backward, each variant in a fresh process (peak RSS above the baseline).

    .venv/bin/python benchmarks/learner.py                       # SmolLM2-135M, bf16, 1 rank
    .venv/bin/python benchmarks/learner.py --model tiny --dtype float32 --ranks 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)  # the repo root, for rlcore/tgc_rl

TINY = {
    "num_hidden_layers": 2,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def make_spec(args, **changes):
    from tgc_rl.config import JobSpec

    model = (
        {"source": "smollm2-135m-instruct", "dtype": args.dtype}
        if args.model == "smollm2"
        else {"source": "random", "dtype": args.dtype, "config_overrides": TINY}
    )
    data = {
        "name": "bench-learner",
        "model": model,
        "objective": {"name": "cp_grpo"},
        "group_size": args.group_size,
        "prompts_per_step": args.groups,
        "steps": 100,
        "sampling": {"max_new_tokens": args.response},
        "optim": {"lr": 1e-6, "micro_batch_size": args.micro_batch_size, "logprob_chunk_tokens": 1024},
        "resources": {"cpus_per_learner": 1},
    }
    data.update(changes)
    return JobSpec.parse(data)


def make_batch(args, seed=0):
    import rlcore
    from tgc_rl.batch import Completion, collate

    gen = torch.Generator().manual_seed(seed)
    prompts, comps, gids, rewards = [], [], [], []
    for g in range(args.groups):
        prompt = torch.randint(
            3,
            40000,
            (int(torch.randint(args.prompt // 2, args.prompt + 1, (1,), generator=gen)),),
            generator=gen,
        ).tolist()
        for i in range(args.group_size):
            n = int(torch.randint(args.response // 2, args.response + 1, (1,), generator=gen))
            prompts.append(prompt)
            comps.append(
                Completion(torch.randint(3, 40000, (n,), generator=gen).tolist(), [-1.0] * n, "stop", 0)
            )
            gids.append(g)
            rewards.append(float(i % 2))
    r = torch.tensor(rewards)
    batch = collate(prompts, comps, gids, r, pad_id=2)
    return batch.with_advantages(
        rlcore.get_objective("cp_grpo").advantages(r, batch.group_ids, batch.response_mask)
    )


def timed_steps(train_step, batches) -> list[float]:
    """Wall seconds of `train_step` on each batch after the first (a warm-up, not timed)."""
    times = []
    for i, b in enumerate(batches):
        t0 = time.perf_counter()
        train_step(b)
        if i:
            times.append(time.perf_counter() - t0)
    return times


# -- 1. step throughput ---------------------------------------------------------------------------------


def plain_loop_step(policy, optimizer, objective, batch, micro_rows, max_new_tokens, dtype):
    """One optimizer step without FSDP: the reference a hand-written single-process trainer would run."""
    import rlcore
    from tgc_rl.learner.plan import trim_padding

    norm = rlcore.StepNorm(
        tokens=float(batch.response_mask.sum()),
        sequences=len(batch),
        length=max(batch.response_mask.shape[1], max_new_tokens),
    )
    optimizer.zero_grad(set_to_none=True)
    for rows in micro_rows:
        m = trim_padding(batch.select(rows))
        # autocast also around backward: the head's custom backward recomputes its logits in bf16 too
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            lp, _ = policy(m.input_ids, m.attention_mask, m.prompt_len, m.response_mask)
            out = objective.loss(lp, lp.detach(), m.advantages, m.response_mask, m.group_ids, step=norm)
            out.loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()


def bench_throughput(args) -> dict[str, float]:
    """Plain loop and FSDP2 learner step alternate on the same batches, so that load on a shared machine
    hits both alike; the first step of each is a warm-up and is not timed."""
    from transformers import AutoModelForCausalLM

    import rlcore
    from tgc_rl.learner import Learner, LearnerSpec
    from tgc_rl.learner.logprobs import PolicyLogprobs
    from tgc_rl.learner.plan import group_spans, plan_minibatches
    from tgc_rl.learner.sharding import compute_dtype
    from tgc_rl.models import model_dir

    spec = make_spec(args)
    path = model_dir(spec.model, spec.seed)
    batches = [make_batch(args, seed=s) for s in range(args.steps + 1)]
    tokens = [float(b.attention_mask.sum()) for b in batches]

    dtype = compute_dtype(args.dtype, torch.device("cpu"))
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    policy = PolicyLogprobs(lm, spec.optim.logprob_chunk_tokens, spec.sampling.temperature).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=spec.optim.lr, fused=True)  # as the learner's
    objective = rlcore.get_objective("cp_grpo")
    # the same computation as the plain loop (one forward per row), and the default (shared prompts)
    learners = {
        shared: Learner(
            LearnerSpec.of(
                make_spec(args, optim={**spec.optim.model_dump(), "shared_prompt_forward": shared})
            ),
            path,
        )
        for shared in (False, True)
    }
    plain_s, times, fwd_bwd_s = [], {False: [], True: []}, []
    for i, b in enumerate(batches):
        rows = plan_minibatches(group_spans(b), 1, 1, learners[False].micro_limit)[0].for_rank(0)
        t0 = time.perf_counter()
        plain_loop_step(policy, optimizer, objective, b, rows, spec.sampling.max_new_tokens, dtype)
        t1 = time.perf_counter()
        line = f"  step {i}: plain {t1 - t0:.1f} s"
        for shared, learner in learners.items():
            t2 = time.perf_counter()
            m = learner.train_step(b)
            elapsed = time.perf_counter() - t2
            line += f", FSDP2 {'shared prompts' if shared else 'full forward'} {elapsed:.1f} s"
            if i:
                times[shared].append(elapsed)
                if not shared:
                    fwd_bwd_s.append(m["timing/fwd_bwd_s"])
        if i:
            plain_s.append(t1 - t0)
        print(line + (" (warm-up)" if i == 0 else ""), flush=True)
    results = {
        "tokens_per_step": sum(tokens) / len(tokens),
        "plain_tokens_per_s": sum(tokens[1:]) / sum(plain_s),
        "fsdp1_tokens_per_s": sum(tokens[1:]) / sum(times[False]),
        "fsdp1_shared_tokens_per_s": sum(tokens[1:]) / sum(times[True]),
        "fsdp1_fwd_bwd_share": sum(fwd_bwd_s) / sum(times[False]),
        "median_ratio": statistics.median(p / f for p, f in zip(plain_s, times[False], strict=True)),
    }
    for learner in learners.values():
        learner.close()
    del learners, lm, policy, optimizer

    if args.ranks > 1:
        import ray

        from tgc_rl.learner import LearnerGroup

        ray.init(
            num_cpus=max(2, args.ranks),
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=512 * 2**20,
        )
        group = LearnerGroup(
            make_spec(
                args,
                resources={
                    "learner_ranks": args.ranks,
                    "cpus_per_learner": 1,
                    "threads_per_actor": args.threads,
                },
            ),
            path,
            "bench-learner",
        )
        elapsed = timed_steps(group.train_step, batches)
        results[f"fsdp{args.ranks}_tokens_per_s"] = sum(tokens[1:]) / sum(elapsed)
        group.shutdown()
        ray.shutdown()
    return results


# -- 2. log-prob head memory -----------------------------------------------------------------------------

_HEAD_CHILD = r"""
import json, os, sys, time, torch
import torch.nn.functional as F
from tgc_rl.learner.logprobs import chunked_head_logprobs
torch.set_num_threads(int(sys.argv[4]))
n, vocab, chunk = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
gen = torch.Generator().manual_seed(0)
h = torch.randn(n, 576, generator=gen, requires_grad=True)
w = (torch.randn(vocab, 576, generator=gen) * 0.02).requires_grad_(True)
t = torch.randint(0, vocab, (n,), generator=gen)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak-RSS mark (VmHWM) to the current RSS
base = status("VmRSS:")
t0 = time.perf_counter()
if chunk == 0:   # whole logits: the (n x vocab) tensor and its softmax exist at once, and again in backward
    logp = F.log_softmax((h @ w.T).float(), -1)
    lp = logp.gather(-1, t[:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
else:
    lp, ent = chunked_head_logprobs(h, w, None, t, chunk)
(lp.sum() + 0.01 * ent.sum()).backward()
print(json.dumps({"peak_bytes": status("VmHWM:") - base, "seconds": time.perf_counter() - t0}))
"""


def bench_head_memory(args) -> dict[str, dict[str, float]]:
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": "65536",
        "PYTHONPATH": os.getcwd(),
    }  # big buffers go back to the OS
    out = {}
    for chunk in [0, *args.chunks]:
        res = subprocess.run(
            [sys.executable, "-c", _HEAD_CHILD, str(args.tokens), "49152", str(chunk), str(args.threads)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        out["full logits" if chunk == 0 else f"chunks of {chunk}"] = json.loads(
            res.stdout.strip().splitlines()[-1]
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompt", type=int, default=48, help="max prompt tokens")
    p.add_argument("--response", type=int, default=96, help="max response tokens")
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    p.add_argument("--ranks", type=int, default=1, help="also time a LearnerGroup of this many ranks (Ray)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens for the log-prob memory benchmark")
    p.add_argument("--chunks", type=int, nargs="+", default=[1024, 256])
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1 avoids OpenMP spin-waits when the cores are shared)",
    )
    p.add_argument("--skip-throughput", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    print(f"# learner benchmark: model={args.model} dtype={args.dtype} threads={args.threads}")
    if not args.skip_throughput:
        r = bench_throughput(args)
        print(
            f"\n## step throughput ({args.groups} groups x {args.group_size}, micro-batch {args.micro_batch_size}, "
            f"~{r['tokens_per_step']:.0f} tokens/step, {args.steps} timed steps)"
        )
        print(f"{'variant':34s} {'tokens/s':>10s} {'vs plain':>9s}")
        print(f"{'plain single-process torch loop':34s} {r['plain_tokens_per_s']:10.1f} {1.0:9.3f}")
        print(
            f"{'FSDP2 learner, 1 rank, full fwd':34s} {r['fsdp1_tokens_per_s']:10.1f} "
            f"{r['fsdp1_tokens_per_s'] / r['plain_tokens_per_s']:9.3f}   (median of per-step ratios "
            f"{r['median_ratio']:.3f})"
        )
        print(
            f"{'FSDP2 learner, 1 rank, shared':34s} {r['fsdp1_shared_tokens_per_s']:10.1f} "
            f"{r['fsdp1_shared_tokens_per_s'] / r['plain_tokens_per_s']:9.3f}"
        )
        if args.ranks > 1:
            k = f"fsdp{args.ranks}_tokens_per_s"
            print(
                f"{f'FSDP2 LearnerGroup, {args.ranks} ranks (Ray)':34s} {r[k]:10.1f} "
                f"{r[k] / r['plain_tokens_per_s']:9.3f}"
            )
        print(f"(fwd+bwd share of the FSDP2 step: {r['fsdp1_fwd_bwd_share']:.2f})")
    m = bench_head_memory(args)
    print(f"\n## log-prob head, {args.tokens} tokens x vocab 49152, forward + backward (fp32)")
    print(f"{'variant':20s} {'peak MiB':>10s} {'vs full':>8s} {'seconds':>8s}")
    full = m["full logits"]["peak_bytes"]
    for name, v in m.items():
        print(f"{name:20s} {v['peak_bytes'] / 2**20:10.1f} {v['peak_bytes'] / full:8.3f} {v['seconds']:8.2f}")


if __name__ == "__main__":
    main()
