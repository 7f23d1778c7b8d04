"""Weight sync: seconds per sync into a rollout replica vs model size, against an in-process state-dict copy.

For each model, one run measures side by side:
  copy      a plain in-process `dst.copy_(src)` of every tensor of the same state dict (warm, preallocated)
  sync      RolloutPool.update_weights(ref): the replica maps the flat buffer from the object store, vLLM
            reloads it in place (q/k/v and gate/up fusion, CPU weight prepacking), prefix cache reset
              get   ray.get in the replica (zero-copy mapping of the object-store buffer)
              load  vLLM's in-place reload inside the replica
  pack      vLLM's CPU weight prepacking (oneDNN / AMX layouts) of the same matrices, run alone: the floor of
            any in-place update of a vLLM CPU engine (GPU engines have no such step)
  publish   the learner-side cost of flattening the state dict and ray.put-ting it (once per step)
  dict      the same sync when the learner puts a plain dict of tensors (pickled tensor by tensor)
  bcast     the same weights through vLLM's native weight-transfer protocol over a gloo broadcast (the CPU
            stand-in of the GPU NCCL path, see tgc_rl/weight_sync/gloo.py)
Target: sync within 2x of copy.

    .venv/bin/python benchmarks/weight_sync.py [--repeats 5] [--sizes smollm2-135m,random-300m]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# A larger random-init Llama (head size 64 for vLLM's CPU attention): ~290M parameters, ~0.6 GB in bf16.
LARGE = {
    "num_hidden_layers": 16,
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}
SIZES = {
    "smollm2-135m": {},  # ModelSpec() default: SmolLM2-135M-Instruct
    "random-300m": {"source": "random", "config_overrides": LARGE},
}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prepacker(state: dict):
    """vLLM's own CPU GEMM dispatch (what its reload re-runs per linear layer) over every matrix."""
    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    mats = [t for t in state.values() if t.ndim == 2]

    def pack() -> None:
        for w in mats:
            layer = torch.nn.Module()
            layer.weight = torch.nn.Parameter(w, requires_grad=False)
            dispatch_cpu_unquantized_gemm(layer, remove_weight=True)

    return pack


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(name: str, model: dict, args) -> dict:
    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from tgc_rl.config import JobSpec
    from tgc_rl.models import model_dir
    from tgc_rl.rollout import RolloutPool
    from tgc_rl.weight_sync.flat import FlatWeights, publish_weights
    from tgc_rl.weight_sync.gloo import GlooSender

    spec = JobSpec.parse(
        {
            "name": f"bench-sync-{name}",
            "model": {**model, "dtype": args.dtype},
            "sampling": {"max_new_tokens": 16, "max_prompt_tokens": 64},
            "resources": {
                "rollout_engine": "vllm",
                "rollout_replicas": args.replicas,
                "cpus_per_rollout": 1,
                "threads_per_actor": args.threads,
                "vllm_memory_fraction": 0.01,
            },
        }
    )
    path = model_dir(spec.model, spec.seed)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype))
    # every parameter once (a tied output embedding is the input embedding), by HF name
    state = {k: v.detach().clone() for k, v in hf.named_parameters()}
    del hf
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    params = sum(t.numel() for t in state.values())
    dst = {k: torch.empty_like(v) for k, v in state.items()}

    def copy() -> None:
        for k, v in state.items():
            dst[k].copy_(v)

    pack = prepacker(state)
    pool = RolloutPool(spec, path, spec.name)
    try:
        ref = publish_weights(state)
        copy(), pack(), pool.update_weights(ref, 1)  # warm-up
        rows = []
        for v in range(args.repeats):  # back to back, so a burst of outside load hits all three alike
            c = timed(copy)
            sync = pool.update_weights(ref, v + 2)
            rows.append({"copy_s": c, "pack_s": timed(pack), **sync})
        publish_s = statistics.median(
            timed(lambda: ray.put(FlatWeights.from_state_dict(state))) for _ in range(args.repeats)
        )
        dict_ref = ray.put(state)
        dict_syncs = [pool.update_weights(dict_ref, 100 + v) for v in range(max(1, args.repeats // 2))]
        sender = GlooSender(pool.sync_client(), "127.0.0.1", free_port())
        sender.send(state, 200)  # warm-up
        bcast_s = statistics.median(
            timed(lambda: sender.send(state, 201)) for _ in range(max(1, args.repeats // 2))
        )
    finally:
        pool.shutdown()
    med = lambda rows, f: statistics.median(f(r) for r in rows)  # noqa: E731
    return {
        "name": name,
        "params": params,
        "mb": nbytes / 1e6,
        **{k: med(rows, lambda r, k=k: r[k]) for k in ("copy_s", "sync_s", "get_s", "load_s", "pack_s")},
        "sync_per_copy": med(rows, lambda r: r["sync_s"] / r["copy_s"]),
        "sync_per_floor": med(rows, lambda r: r["sync_s"] / (r["copy_s"] + r["pack_s"])),
        "publish_s": publish_s,
        "dict_sync_s": med(dict_syncs, lambda r: r["sync_s"]),
        "dict_get_s": med(dict_syncs, lambda r: r["get_s"]),
        "bcast_s": bcast_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, from {list(SIZES)}")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="torch threads in the replica and this process")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args()

    import ray
    import torch

    torch.set_num_threads(args.threads)
    ray.init(
        address="local",
        num_cpus=max(2, args.replicas),
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=4 << 30,
    )
    try:
        rows = [measure(name, SIZES[name], args) for name in args.sizes.split(",")]
    finally:
        ray.shutdown()

    print(
        f"\nWeight sync ({args.dtype}, {args.replicas} replica(s), vLLM CPU, medians of {args.repeats}; seconds;"
        " ratios are medians of per-repeat ratios)"
    )
    print(
        f"{'model':<14} {'params':>7} {'MB':>6} {'copy':>7} {'sync':>7} {'sync/copy':>9} {'get':>7} {'load':>7} "
        f"{'pack':>7} {'sync/(copy+pack)':>16} {'publish':>8} {'dict sync':>10} {'dict get':>9} {'bcast':>7}"
    )
    for r in rows:
        print(
            f"{r['name']:<14} {r['params'] / 1e6:>6.0f}M {r['mb']:>6.0f} {r['copy_s']:>7.3f} {r['sync_s']:>7.3f} "
            f"{r['sync_per_copy']:>9.1f} {r['get_s']:>7.4f} {r['load_s']:>7.3f} {r['pack_s']:>7.3f} "
            f"{r['sync_per_floor']:>16.2f} {r['publish_s']:>8.3f} {r['dict_sync_s']:>10.3f} "
            f"{r['dict_get_s']:>9.3f} {r['bcast_s']:>7.3f}"
        )
    print(
        "copy: in-process dst.copy_(src) of the same state dict; sync: RolloutPool.update_weights end to end;"
    )
    print("get/load: inside the replica; pack: vLLM's CPU prepacking of the same matrices alone (its floor);")
    print("publish: flatten + ray.put on the learner side; dict: the same sync from a plain-dict ref;")
    print("bcast: vLLM's weight-transfer protocol over a gloo broadcast from this process.")
    print(f"load average: {os.getloadavg()[0]:.2f} (1 min), cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
