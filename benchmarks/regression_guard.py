"""Speed regression guard: ratios measured side by side in one run, against stored baselines.

Absolute times on a shared machine swing 2-4x with the load; a ratio of two things measured alternately in
one process, on this process's CPU clock (1 thread: no OpenMP spin-waits), much less so. Each ratio below is "higher is better" and is flagged when it falls more than 20%
under its baseline (benchmarks/baselines.json); exit status 1 then.

- `learner_vs_plain`: a plain single-process torch loop's step time over the 1-rank FSDP2 learner's, the
  same computation (full forward) on the same micro-batches: the learner's own overhead.
- `shared_prompt_speedup`: the learner's step time with one forward per row over its time with shared
  prompts (the default), at the default job's shapes.

The same file holds `vs_trl_<config>_speedup` (TRL's median step over tgc-rl's, end to end), which
benchmarks/vs_trl.py checks and stores itself (a run takes 4-8 minutes a config); `--update` here keeps them.

    .venv/bin/python benchmarks/regression_guard.py            # check
    .venv/bin/python benchmarks/regression_guard.py --update   # store the measured ratios as the baseline
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learner import make_batch, make_spec, plain_loop_step  # noqa: E402  (benchmarks/learner.py)

BASELINES = Path(__file__).with_name("baselines.json")
TOLERANCE = 0.8  # flag a ratio below 80% of its baseline


def measure(steps: int, threads: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    import rlcore
    from tgc_rl.learner import Learner, LearnerSpec
    from tgc_rl.learner.logprobs import PolicyLogprobs
    from tgc_rl.learner.plan import group_spans, plan_minibatches
    from tgc_rl.models import model_dir

    torch.set_num_threads(threads)
    shape = argparse.Namespace(
        model="smollm2", dtype="bfloat16", groups=2, group_size=8, prompt=58, response=16, micro_batch_size=16
    )
    spec = make_spec(shape)
    path = model_dir(spec.model, spec.seed)
    learners = {
        shared: Learner(
            LearnerSpec.of(
                make_spec(shape, optim={**spec.optim.model_dump(), "shared_prompt_forward": shared})
            ),
            path,
        )
        for shared in (False, True)
    }
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    policy = PolicyLogprobs(lm, spec.optim.logprob_chunk_tokens, spec.sampling.temperature).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=spec.optim.lr, fused=True)  # as the learner's
    objective = rlcore.get_objective("cp_grpo")
    ratios: dict[str, list[float]] = {"learner_vs_plain": [], "shared_prompt_speedup": []}
    for i in range(steps + 1):
        batch = make_batch(shape, seed=i)
        rows = plan_minibatches(group_spans(batch), 1, 1, learners[False].micro_limit)[0].for_rank(0)
        t = {}
        t0 = time.process_time()
        plain_loop_step(
            policy,
            optimizer,
            objective,
            batch,
            rows,
            spec.sampling.max_new_tokens,
            learners[False].compute_dtype,
        )
        t["plain"] = time.process_time() - t0
        for shared, learner in learners.items():
            t0 = time.process_time()
            learner.train_step(batch)
            t[shared] = time.process_time() - t0
        if i:  # the first step is warm-up
            ratios["learner_vs_plain"].append(t["plain"] / t[False])
            ratios["shared_prompt_speedup"].append(t[False] / t[True])
        print(
            f"  step {i}: plain {t['plain']:.2f} s, learner {t[False]:.2f} s, shared {t[True]:.2f} s",
            flush=True,
        )
    for learner in learners.values():
        learner.close()
    return {k: statistics.median(v) for k, v in ratios.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--update", action="store_true", help="store the measured ratios as the new baseline")
    args = p.parse_args()
    got = measure(args.steps, args.threads)
    base = json.loads(BASELINES.read_text()) if BASELINES.exists() else {}
    failed = []
    print(f"{'ratio (higher is better)':28s} {'measured':>9s} {'baseline':>9s} {'vs base':>8s}")
    for key, value in got.items():
        ref = base.get(key)
        rel = value / ref if ref else float("nan")
        flag = ref is not None and rel < TOLERANCE
        failed += [key] if flag else []
        print(
            f"{key:28s} {value:9.3f} {ref if ref else float('nan'):9.3f} {rel:8.2f}{'  SLOWER' if flag else ''}"
        )
    if args.update:
        stored = {**base, **{k: round(v, 3) for k, v in got.items()}}  # keeps vs_trl.py's end-to-end keys
        BASELINES.write_text(json.dumps(stored, indent=2) + "\n")
        print(f"baseline written to {BASELINES}")
    elif failed:
        print(f"regression: {', '.join(failed)} more than {1 - TOLERANCE:.0%} below the baseline")
        sys.exit(1)


if __name__ == "__main__":
    main()
