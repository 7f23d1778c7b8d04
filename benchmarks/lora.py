"""Full weights vs LoRA on one learner rank (no Ray, no engine), each variant in a fresh process: optimizer step
time on a fixed synthetic batch, peak RSS above the process's baseline after imports, and what one weight sync
publishes (bytes, and the seconds to gather + pack them into the object-store buffer).

    flock /tmp/tgc-heavy.lock .venv/bin/python benchmarks/lora.py [--model tiny|smollm2] [--steps 3]
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--variant", choices=["full", "lora"], help=argparse.SUPPRESS)  # one child process
    args = ap.parse_args()
    if args.variant:
        print(json.dumps(one_variant(args.model, args.variant == "lora", args.steps)))
        return
    rows = {}
    for variant in ("full", "lora"):
        cmd = [
            sys.executable,
            __file__,
            "--model",
            args.model,
            "--steps",
            str(args.steps),
            "--variant",
            variant,
        ]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        rows[variant] = json.loads(out.stdout.strip().splitlines()[-1])
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
