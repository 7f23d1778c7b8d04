"""The actors' allocator setting: learner steps and generation with and without it, side by side.

A job's actors start with glibc's `MALLOC_MMAP_MAX_=0` and a high `MALLOC_TRIM_THRESHOLD_`
(tgc_rl.trainer.main.ALLOCATOR_ENV): buffers over 32 MiB come from the heap and stay there, instead of a
fresh mmap that every step page-faults in again. This runs the same work in child processes started with
glibc's defaults and with the setting, alternating, and reports the medians, their ratio and the kernel's
share (system CPU seconds, minor page faults) of each child:

- `learner`: tgc_rl.learner.Learner (1 rank, 2 threads) on the default job's shapes (8 prompts x 8
  responses, ~45 prompt and <= 16 response tokens), the default job's micro-batching, `--steps` timed steps
  after a warm-up;
- `generate`: the rollout engine's vLLM arguments, 8 prompts x 8 samples x 16 new tokens at T = 0.7, the
  per-sample seeds the trainer uses.

    flock /tmp/tgc-heavy.lock .venv/bin/python benchmarks/allocator.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def learner_child(steps: int) -> list[float]:
    import torch
    from learner import make_batch, make_spec, timed_steps  # benchmarks/learner.py

    from tgc_rl.config import JobSpec
    from tgc_rl.learner import Learner, LearnerSpec
    from tgc_rl.models import model_dir

    torch.set_num_threads(2)
    optim = JobSpec.from_yaml(ROOT / "examples" / "default.yaml").optim.model_dump()
    shape = argparse.Namespace(
        model="smollm2", dtype="bfloat16", groups=8, group_size=8, prompt=50, response=16, micro_batch_size=64
    )
    spec = make_spec(shape, optim={**optim, "lr": 1e-6}, resources={"cpus_per_learner": 2})
    learner = Learner(LearnerSpec.of(spec), model_dir(spec.model, spec.seed))
    batches = [make_batch(shape, seed=s) for s in range(steps + 1)]
    times = timed_steps(learner.train_step, batches)
    learner.close()
    return times


def generate_child(steps: int) -> list[float]:
    import torch

    from tgc_rl.config import JobSpec
    from tgc_rl.models import load_tokenizer, model_dir
    from tgc_rl.rollout import RolloutSpec, sample_seed
    from tgc_rl.rollout.vllm_engine import engine_args, in_process_llm, sampling_params
    from tgc_rl.tasks.arithmetic import ArithmeticTask
    from tgc_rl.trainer.data import encode_item

    spec = JobSpec.parse(
        {
            "name": "bench-allocator",
            "model": {"dtype": "bfloat16"},
            "sampling": {"max_new_tokens": 16, "temperature": 0.7},
            "resources": {"rollout_engine": "vllm", "cpus_per_rollout": 2, "threads_per_actor": 2},
        }
    )
    rspec = RolloutSpec.of(spec)
    tok = load_tokenizer(spec.model)
    task = ArithmeticTask(seed=0)
    prompts = [list(encode_item(tok, spec.model, task.item(i))) for i in range(8)]
    torch.set_num_threads(2)
    llm = in_process_llm(engine_args(rspec, model_dir(spec.model, spec.seed)))
    eos = int(tok.eos_token_id)
    requests = [{"prompt_token_ids": p} for p in prompts for _ in range(8)]
    times = []
    for step in range(steps + 1):
        params = [
            sampling_params(rspec, sample_seed(step * 8 + i, j), eos) for i in range(8) for j in range(8)
        ]
        t0 = time.perf_counter()
        llm.generate(requests, params, use_tqdm=False)
        if step:
            times.append(time.perf_counter() - t0)
    return times


def run_child(work: str, steps: int, heap: bool) -> dict:
    from tgc_rl.trainer.main import ALLOCATOR_ENV

    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV}
    if heap:
        env.update(ALLOCATOR_ENV)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [sys.executable, __file__, "--child", work, "--steps", str(steps)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    times = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "times": times,
        "sys_s": after.ru_stime - before.ru_stime,
        "user_s": after.ru_utime - before.ru_utime,
        "minor_faults": after.ru_minflt - before.ru_minflt,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", nargs="+", choices=["learner", "generate"], default=["learner", "generate"])
    p.add_argument("--steps", type=int, default=6, help="timed steps a child, after one warm-up")
    p.add_argument("--rounds", type=int, default=2, help="children of each setting, alternating")
    p.add_argument("--child", choices=["learner", "generate"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        times = (learner_child if args.child == "learner" else generate_child)(args.steps)
        print(json.dumps(times))
        return
    from tgc_rl.trainer.main import ALLOCATOR_ENV

    setting = " ".join(f"{k}={v}" for k, v in ALLOCATOR_ENV.items())
    print(f"# allocator: glibc defaults vs {setting}, {args.rounds} rounds x {args.steps} steps")
    print(f"{'work':9s} {'setting':9s} {'median s':>9s} {'sys s':>7s} {'user s':>7s} {'minor faults':>13s}")
    for work in args.work:
        runs: dict[bool, list[dict]] = {False: [], True: []}
        for r in range(args.rounds):
            for heap in (False, True) if r % 2 == 0 else (True, False):
                runs[heap].append(run_child(work, args.steps, heap))
        med = {}
        for heap, rs in runs.items():
            med[heap] = statistics.median(t for x in rs for t in x["times"])
            print(
                f"{work:9s} {'heap' if heap else 'default':9s} {med[heap]:9.3f} "
                f"{sum(x['sys_s'] for x in rs) / len(rs):7.1f} {sum(x['user_s'] for x in rs) / len(rs):7.1f} "
                f"{sum(x['minor_faults'] for x in rs) / len(rs):13.0f}"
            )
        print(f"{work:9s} speedup   {med[False] / med[True]:9.2f}x  (default / heap, median step)")


if __name__ == "__main__":
    main()
