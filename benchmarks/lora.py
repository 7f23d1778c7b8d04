"""Full weights vs LoRA on one learner rank (no Ray, no engine), each variant in a fresh process: optimizer step
time on a fixed synthetic batch, peak RSS above the process's baseline after imports, and what one weight sync
publishes (bytes, and the seconds to gather + pack them into the object-store buffer).

    flock /tmp/tgc-heavy.lock .venv/bin/python benchmarks/lora.py [--model tiny|smollm2] [--steps 3]

`--tenants 2`: the rollout side of two LoRA jobs on one base, side by side, each rollout mode in a fresh process
with its own local Ray: `own` (each job its own vLLM replica) vs `shared` (one shared engine serving both jobs'
adapters, resources.rollout_sharing). Each job loads a random adapter, generates and scores the canary sequence
twice (two syncs); the peak summed RSS and PSS of the rollout processes (psutil, sampled every 0.2 s) and the
seconds to start both jobs' rollout.

    flock /tmp/tgc-heavy.lock .venv/bin/python benchmarks/lora.py --model smollm2 --tenants 2

`--generation`: vLLM's generation with an adapter (rank 16, every linear layer) against the base model, on one
in-process engine (`VLLMEngine`, one adapter loaded), with vLLM's own CPU LoRA ops and with
tgc_rl/rollout/lora_cpu.py's per-adapter matmuls, the three variants alternating over `--repeats`; the same
prompts and seeds in each.

    flock /tmp/tgc-heavy.lock .venv/bin/python benchmarks/lora.py --model smollm2 --generation
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root: tgc_rl and the tests' model and batches

from tests.learner.conftest import TINY_MODEL  # noqa: E402

MODELS = {
    "tiny": TINY_MODEL,  # the learner tests' model: 2 layers, hidden 128
    "smollm2": {"source": "smollm2-135m-instruct", "dtype": "float32"},
}
LORA = {"rank": 16, "alpha": 32}


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def one_variant(model: str, lora: bool, steps: int) -> dict[str, float]:
    import torch

    from tests.batches import build_batch
    from tgc_rl.config import JobSpec
    from tgc_rl.learner import Learner, LearnerSpec
    from tgc_rl.models import model_dir
    from tgc_rl.weight_sync.adapter import AdapterWeights
    from tgc_rl.weight_sync.flat import FlatWeights

    torch.set_num_threads(1)
    spec = JobSpec.parse(
        {
            "name": "lora-bench",
            "model": {**MODELS[model], **({"lora": LORA} if lora else {})},
            "group_size": 4,
            "prompts_per_step": 4,
            "steps": steps + 1,
            "sampling": {"max_new_tokens": 32},
            "optim": {"lr": 1e-4, "micro_batch_size": 16},
        }
    )
    path = model_dir(spec.model, spec.seed)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark to the current RSS
    base = _status("VmRSS:")
    learner = Learner(LearnerSpec.of(spec), path)
    batch = build_batch(n_groups=4, group_size=4, max_response=32)
    learner.train_step(batch)  # warm-up: allocations, AdamW state
    t0 = time.perf_counter()
    for _ in range(steps):
        learner.train_step(batch)
    step_s = (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    if lora:
        packed: FlatWeights = AdapterWeights.pack(learner.adapter_state_dict(), LORA["rank"], LORA["alpha"])
    else:
        packed = FlatWeights.from_state_dict(learner.full_state_dict())
    publish_s = time.perf_counter() - t0
    return {
        "step_s": step_s,
        "peak_mib": (_status("VmHWM:") - base) / 2**20,
        "sync_mib": packed.nbytes / 2**20,
        "publish_s": publish_s,
        "trainable": float(sum(p.numel() for g in learner.optimizer.param_groups for p in g["params"])),
    }


def _adapter(path: Path, rank: int, alpha: int, seed: int):
    """A random all-linear adapter for the Llama at `path` with non-zero B (what a trained one looks like)."""
    import torch

    from tgc_rl.weight_sync.adapter import AdapterWeights, peft_name

    cfg = json.loads((path / "config.json").read_text())
    hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
    head = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head
    shapes = {
        "self_attn.q_proj": (hidden, hidden),
        "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv),
        "self_attn.o_proj": (hidden, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for module, (fan_in, fan_out) in shapes.items():
            stem = f"model.layers.{layer}.{module}"
            tensors[peft_name(f"{stem}.lora_A.default.weight")] = (
                torch.randn(rank, fan_in, generator=g) * 0.01
            )
            tensors[peft_name(f"{stem}.lora_B.default.weight")] = (
                torch.randn(fan_out, rank, generator=g) * 0.01
            )
    return AdapterWeights.pack(tensors, rank, alpha)


def _tree_memory(pids: list[int]) -> tuple[float, float]:
    """Summed RSS and PSS (MiB) of `pids` and their descendants."""
    import psutil

    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs[pid] = p
            procs.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
    rss = pss = 0
    for p in procs.values():
        try:
            info = p.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rss, pss = rss + info.rss, pss + info.pss
    return rss / 2**20, pss / 2**20


def one_tenants_mode(model: str, mode: str, tenants: int) -> dict[str, float]:
    """`tenants` LoRA jobs' rollout (RolloutPool) side by side in `mode` (own / shared), in a local Ray."""
    import threading

    import ray

    from tgc_rl.config import JobSpec
    from tgc_rl.models import model_dir
    from tgc_rl.rollout import RolloutPool
    from tgc_rl.rollout.shared import GRACE_ENV, NAME_PREFIX, NAMESPACE
    from tgc_rl.weight_sync.sync import CANARY_TOKENS

    os.environ[GRACE_ENV] = "0"
    specs = [
        JobSpec.parse(
            {
                "name": f"tenant-{i}",
                "model": {**MODELS[model], "lora": LORA},
                "group_size": 4,
                "prompts_per_step": 4,
                "sampling": {"max_new_tokens": 32, "max_prompt_tokens": 96},
                "resources": {
                    "rollout_engine": "vllm",
                    "rollout_sharing": mode,
                    "vllm_memory_fraction": 0.02,
                    "cpus_per_rollout": 1,
                    "threads_per_actor": 1,
                },
            }
        )
        for i in range(tenants)
    ]
    path = model_dir(specs[0].model, 0)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    peak = {"rss": 0.0, "pss": 0.0}
    pids: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            rss, pss = _tree_memory(list(pids))
            peak["rss"], peak["pss"] = max(peak["rss"], rss), max(peak["pss"], pss)
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    pools = [RolloutPool(s, path, s.name) for s in specs]
    start_s = time.perf_counter() - t0
    if mode == "shared":
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        engine = ray.get_actor(next(n for n in names if n.startswith(NAME_PREFIX)), namespace=NAMESPACE)
        pids.append(ray.get(engine.describe.remote())["pid"])
    else:
        pids.extend(p for pool in pools for p in pool.pids())
    prompts = [[1, *range(100 + 7 * i, 140 + 7 * i)] for i in range(4)]
    t0 = time.perf_counter()
    canary = []
    for version in (1, 2):
        for i, pool in enumerate(pools):
            pool.update_weights(_adapter(path, LORA["rank"], LORA["alpha"], seed=10 * i + version), version)
            pool.generate(prompts, 4, list(range(len(prompts))))
            canary.append(pool.score([CANARY_TOKENS], 8)[0])
    work_s = time.perf_counter() - t0
    rss, pss = _tree_memory(pids)
    stop.set()
    sampler.join()
    for pool in pools:
        pool.shutdown()
    ray.shutdown()
    differ = sum(abs(a - b) for a, b in zip(canary[-2], canary[-1], strict=True)) / len(canary[-1])
    return {
        "start_s": start_s,
        "work_s": work_s,
        "processes": float(len(pids)),
        "rss_mib": rss,
        "pss_mib": pss,
        "peak_rss_mib": peak["rss"],
        "peak_pss_mib": peak["pss"],
        "canary_tenants_differ": differ,
    }


def generation(model: str, repeats: int, max_new_tokens: int, threads: int) -> None:
    """Tokens/s of one engine's generation: the base, the adapter on vLLM's CPU ops, the adapter on ours."""
    import statistics

    import torch
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    from tgc_rl.config import JobSpec
    from tgc_rl.models import load_tokenizer, model_dir
    from tgc_rl.rollout import RolloutSpec, lora_cpu, sample_seed
    from tgc_rl.rollout.vllm_engine import VLLMEngine, sampling_params
    from tgc_rl.tasks.arithmetic import ArithmeticTask

    spec = JobSpec.parse(
        {
            "name": "bench-lora-generation",
            "model": {**MODELS[model], "lora": LORA},
            "sampling": {"max_new_tokens": max_new_tokens, "max_prompt_tokens": 128, "temperature": 1.0},
            "resources": {
                "rollout_engine": "vllm",
                "cpus_per_rollout": threads,
                "vllm_memory_fraction": 0.03,
            },
        }
    )
    rspec, path = RolloutSpec.of(spec), model_dir(spec.model, spec.seed)
    torch.set_num_threads(threads)
    engine = VLLMEngine(rspec, path)  # installs the per-adapter ops (model.lora on a CPU)
    engine.update_weights(_adapter(path, LORA["rank"], LORA["alpha"], seed=1), 1)
    ops = {
        "vllm": {name: lora_cpu._ORIGINAL[name] for name in lora_cpu._OURS},
        "ours": dict(lora_cpu._OURS),
    }
    tok = load_tokenizer(spec.model)
    task = ArithmeticTask(seed=0)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": task.item(i).prompt}], add_generation_prompt=True
        )
        for i in range(8)
    ]
    prompts = [list(p["input_ids"] if hasattr(p, "keys") else p) for p in prompts]
    requests = [{"prompt_token_ids": p} for p in prompts for _ in range(8)]
    params = [sampling_params(rspec, sample_seed(i, j), engine.eos_id) for i in range(8) for j in range(8)]

    def run(variant: str) -> tuple[float, int, list[list[int]]]:
        for name, op in ops["ours" if variant == "base" else variant].items():
            setattr(lora_ops, name, op)
            setattr(punica_cpu, name, op)
        lora = None if variant == "base" else engine._lora  # the served adapter (a benchmark may look inside)
        t0 = time.perf_counter()
        outs = engine.llm.generate(requests, params, use_tqdm=False, lora_request=lora)
        dt = time.perf_counter() - t0
        ids = [list(o.outputs[0].token_ids) for o in outs]
        return dt, sum(map(len, ids)), ids

    variants = ["base", "vllm", "ours"]
    for v in variants:  # warm-up: first-call set-up of each path
        run(v)
    rate: dict[str, list[float]] = {v: [] for v in variants}
    same = []
    for r in range(repeats):
        order = variants if r % 2 == 0 else variants[::-1]
        got = {v: run(v) for v in order}
        for v in variants:
            rate[v].append(got[v][1] / got[v][0])
        same.append(sum(a == b for a, b in zip(got["vllm"][2], got["ours"][2], strict=True)) / len(requests))
    engine.close()
    print(
        f"\nLoRA generation  ({model}, rank {LORA['rank']} every linear layer, 8 prompts x 8 samples, <= "
        f"{max_new_tokens} new tokens, {threads} threads, vLLM CPU, {repeats} repeats alternating)"
    )
    for v in variants:
        print(
            f"{v:5s} tok/s median {statistics.median(rate[v]):8.1f}  runs "
            + " ".join(f"{x:.1f}" for x in rate[v])
        )
    base = statistics.median(rate["base"])
    print(
        f"adapter / base throughput: vLLM's ops {statistics.median(rate['vllm']) / base:.3f}, ours "
        f"{statistics.median(rate['ours']) / base:.3f}; ours / vLLM's "
        f"{statistics.median(rate['ours']) / statistics.median(rate['vllm']):.2f}x; responses identical "
        f"(ours vs vLLM's ops, same seeds): {statistics.mean(same):.3f}"
    )
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min)")


def _child(*args: str) -> dict[str, float]:
    """Run this script with `args` in a fresh process; its last stdout line is a JSON row."""
    out = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def tenants_main(model: str, tenants: int) -> None:
    rows = {m: _child("--model", model, "--tenants", str(tenants), "--mode", m) for m in ("own", "shared")}
    print(
        f"model {model}, {tenants} LoRA jobs (rank {LORA['rank']}), rollout side, vllm_memory_fraction 0.02 each"
    )
    print(
        f"{'mode':7s} {'procs':>5s} {'start s':>8s} {'work s':>7s} {'peak RSS':>9s} {'peak PSS':>9s} {'differ':>7s}"
    )
    for name, r in rows.items():
        print(
            f"{name:7s} {int(r['processes']):5d} {r['start_s']:8.1f} {r['work_s']:7.1f} {r['peak_rss_mib']:9.0f} "
            f"{r['peak_pss_mib']:9.0f} {r['canary_tenants_differ']:7.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variant", choices=["full", "lora"], help=argparse.SUPPRESS)  # one child process
    ap.add_argument("--tenants", type=int, default=0, help="LoRA jobs' rollout side by side, own vs shared")
    ap.add_argument("--mode", choices=["own", "shared"], help=argparse.SUPPRESS)  # one child process
    ap.add_argument("--generation", action="store_true", help="generation with an adapter vs the base")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.generation:
        generation(args.model, args.repeats, args.max_new_tokens, args.threads)
        return
    if args.tenants:
        if args.tenants < 2:
            sys.exit("--tenants: give 2 or more jobs (sharing needs several)")
        if args.mode:
            print(json.dumps(one_tenants_mode(args.model, args.mode, args.tenants)))
        else:
            tenants_main(args.model, args.tenants)
        return
    if args.variant:
        print(json.dumps(one_variant(args.model, args.variant == "lora", args.steps)))
        return
    rows = {
        v: _child("--model", args.model, "--steps", str(args.steps), "--variant", v) for v in ("full", "lora")
    }
    print(
        f"model {args.model}, LoRA rank {LORA['rank']} alpha {LORA['alpha']} all-linear, {args.steps} steps"
    )
    print(
        f"{'variant':8s} {'step s':>8s} {'peak MiB':>9s} {'sync MiB':>9s} {'publish s':>9s} {'trainable':>11s}"
    )
    for name, r in rows.items():
        print(
            f"{name:8s} {r['step_s']:8.3f} {r['peak_mib']:9.1f} {r['sync_mib']:9.3f} {r['publish_s']:9.3f} "
            f"{int(r['trainable']):11d}"
        )


if __name__ == "__main__":
    main()
