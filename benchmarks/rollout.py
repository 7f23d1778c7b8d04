"""Rollout throughput: tokens/s through the rollout actor (RolloutPool, 1 replica) vs the same vLLM called directly.

Both sides use the same `vllm.LLM` arguments (`engine_args`), the same prompts, seeds and SamplingParams,
and the same number of threads; runs alternate so that load from other processes hits both alike.
The ratio actor/direct is the overhead of the actor layer (Ray calls, result transfer, Completion objects);
target >= 0.95.

    .venv/bin/python benchmarks/rollout.py [--prompts 8 --samples 8 --max-new-tokens 64 --repeats 4]
    .venv/bin/python benchmarks/rollout.py --task countdown --max-new-tokens 1024   # reasoning lengths

`--task countdown` asks for the steps before the answer (benchmarks/long_tail.py's prompt), so responses run
to hundreds of tokens, their lengths sampled as the model writes them; the default arithmetic prompts end in a
few tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8, help="samples per prompt (group size)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--task", default="arithmetic", choices=["arithmetic", "countdown"])
    args = ap.parse_args()

    import ray
    import torch

    from benchmarks.long_tail import REASONING_TEMPLATE
    from tgc_rl.config import JobSpec
    from tgc_rl.models import load_tokenizer, model_dir
    from tgc_rl.rollout import RolloutPool, RolloutSpec, sample_seed
    from tgc_rl.rollout.vllm_engine import engine_args, in_process_llm, sampling_params
    from tgc_rl.tasks.arithmetic import ArithmeticTask
    from tgc_rl.tasks.countdown import CountdownParams, CountdownTask

    spec = JobSpec.parse(
        {
            "name": "bench-rollout",
            "model": {"dtype": args.dtype},  # SmolLM2-135M-Instruct, the embedded default
            "sampling": {"max_new_tokens": args.max_new_tokens, "max_prompt_tokens": 128, "temperature": 1.0},
            "resources": {
                "rollout_engine": "vllm",
                "rollout_replicas": 1,
                "cpus_per_rollout": args.threads,
                "threads_per_actor": args.threads,
                "vllm_memory_fraction": 0.03,
            },
        }
    )
    path = model_dir(spec.model, spec.seed)
    tok = load_tokenizer(spec.model)
    task = (
        ArithmeticTask(seed=0)
        if args.task == "arithmetic"
        else CountdownTask(seed=0, params=CountdownParams(template=REASONING_TEMPLATE))
    )
    prompts = []
    for i in range(args.prompts):
        enc = tok.apply_chat_template(
            [{"role": "user", "content": task.item(i).prompt}], add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
    seeds = list(range(args.prompts))
    n = args.samples

    ray.init(address="local", num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
    t0 = time.perf_counter()
    pool = RolloutPool(spec, path, "bench-rollout")
    actor_start = time.perf_counter() - t0
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    llm = in_process_llm(engine_args(RolloutSpec.of(spec), path))
    direct_start = time.perf_counter() - t0
    eos = int(tok.eos_token_id)
    requests = [{"prompt_token_ids": p} for p in prompts for _ in range(n)]
    params = [sampling_params(RolloutSpec.of(spec), sample_seed(s, j), eos) for s in seeds for j in range(n)]

    import psutil

    me = psutil.Process()
    actor_proc = psutil.Process(pool.pids()[0])

    def cpu_s(*procs) -> float:
        return sum(p.cpu_times().user + p.cpu_times().system for p in procs)

    def direct() -> tuple[int, float, float, list]:
        c, t = cpu_s(me), time.perf_counter()
        outs = llm.generate(requests, params, use_tqdm=False)
        dt, dc = time.perf_counter() - t, cpu_s(me) - c
        ids = [list(o.outputs[0].token_ids) for o in outs]
        return sum(map(len, ids)), dt, dc, ids

    inside: list[float] = []  # seconds spent in the replica's engine.generate, per actor call

    def through_actor() -> tuple[int, float, float, list]:
        g = ray.get(pool.actors[0].stats.remote())["generate_s"]
        c, t = cpu_s(me, actor_proc), time.perf_counter()
        out = pool.generate(prompts, n, seeds)
        dt, dc = time.perf_counter() - t, cpu_s(me, actor_proc) - c
        inside.append(ray.get(pool.actors[0].stats.remote())["generate_s"] - g)
        ids = [c.token_ids for cs in out for c in cs]
        return sum(map(len, ids)), dt, dc, ids

    try:
        direct()
        through_actor()  # warm-up: first-call kernel set-up on both sides
        rows = []
        same = True
        for r in range(args.repeats):
            # alternate the order so a burst of load from other processes does not always hit the same side
            first, second = (direct, through_actor) if r % 2 == 0 else (through_actor, direct)
            a, b = first(), second()
            d, a_ = (a, b) if first is direct else (b, a)
            same &= d[3] == a_[3]
            rows.append((r, d[0], d[1], d[2], a_[1], a_[2], inside[-1]))
    finally:
        pool.shutdown()
        ray.shutdown()

    print(
        f"\nRollout throughput  (SmolLM2-135M-Instruct {args.dtype}, {args.task}, {args.prompts} prompts x {n} samples, "
        f"<= {args.max_new_tokens} new tokens, {args.threads} threads each, vLLM CPU in-process engine core)"
    )
    print(f"start-up: actor {actor_start:.1f} s (incl. Ray worker + imports), direct {direct_start:.1f} s")
    print(
        f"{'run':>4} {'tokens':>7} {'direct s':>9} {'direct tok/s':>13} {'actor s':>8} {'actor tok/s':>12} "
        f"{'wall ratio':>10} {'cpu ratio':>10} {'in engine s':>11} {'layer ovh s':>11}"
    )
    wall, cpu, layer = [], [], []
    for r, tok, d_s, d_cpu, a_s, a_cpu, in_s in rows:
        wall.append(d_s / a_s)
        cpu.append(d_cpu / a_cpu)
        layer.append(in_s / a_s)
        print(
            f"{r:>4} {tok:>7} {d_s:>9.2f} {tok / d_s:>13.1f} {a_s:>8.2f} {tok / a_s:>12.1f} {wall[-1]:>10.3f} "
            f"{cpu[-1]:>10.3f} {in_s:>11.2f} {a_s - in_s:>11.3f}"
        )
    print(
        f"median actor/direct throughput: wall {statistics.median(wall):.3f}, per CPU-second "
        f"{statistics.median(cpu):.3f}  (target >= 0.95)"
    )
    print(
        f"share of an actor call spent inside the engine (1 - actor-layer overhead): {statistics.median(layer):.4f}"
    )
    print("  wall: tokens per wall second; per CPU-second: tokens per CPU second of the processes involved")
    print(
        "  (direct: this process; actor: the replica's process plus this one), less sensitive to other load;"
    )
    print(
        "  layer ovh: pool.generate wall time minus the replica's own engine.generate time (Ray call, transfer)"
    )
    print(f"identical tokens on both paths (same seeds): {same}")
    print(f"load average during the run: {os.getloadavg()[0]:.2f} (1 min), cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
