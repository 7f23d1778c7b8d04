"""Step time of one job in the three async modes, side by side in one run: `sync`, `one_step_off` and
`k_step` (k = 2). Target (issue 31): an async step <= 1.15x max(generation + reward, learner) of the same
config, the most overlapping the two phases can give. The async modes run the default behaviour correction
(token_tis, C = 2): k3 is the mismatch of the engine's log-probs to the learner's (it grows with the lag) and
"TIS cut" the share of tokens whose weight the cap truncated; "spread" the largest difference of the engine's
log-probs across copies of one shared token (0: token TIS keeps cancellation) and D2 the largest residual.

Runs real jobs (local Ray, the spec's engines and learner), one after another, and reads their metrics.jsonl.
    flock /tmp/tgc-heavy.lock .venv/bin/python benchmarks/async_modes.py [examples/tiny.yaml] [--steps 8]
    (examples/default.yaml: the default job, SmolLM2-135M with vLLM's CPU backend)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Literal

from tgc_rl.config import AsyncSpec, JobSpec, cpu_model
from tgc_rl.run_layout import (
    BEHAVIOUR_CORRECTED_FRAC,
    D2_RESIDUAL,
    MISMATCH_K3,
    MISMATCH_SPREAD_MAX,
    POLICY_STALENESS_MAX,
    REWARD_MEAN,
)
from tgc_rl.trainer.main import run

MODES: list[tuple[Literal["sync", "one_step_off", "k_step"], int]] = [
    ("sync", 1),
    ("one_step_off", 1),
    ("k_step", 2),
]
WARM_UP = 2  # steps left out: one-off costs, and the queue filling in k_step mode


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(r.get(key, 0.0) for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("spec", nargs="?", default="examples/tiny.yaml")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    print(
        f"{args.spec}: {args.steps} steps per mode (first {WARM_UP} left out); CPU {cpu_model()}, {os.cpu_count()} cores"
    )
    print(
        f"{'mode':<16}{'step s':>9}{'gen+rew s':>11}{'train s':>9}{'step/max':>10}{'lag max':>9}{'k3':>10}"
        f"{'TIS cut':>9}{'spread':>10}{'D2 max':>10}{'reward':>8}"
    )
    for mode, k in MODES:
        spec = JobSpec.from_yaml(args.spec)
        spec.steps = args.steps
        spec.checkpoint.every_steps = 0
        spec.async_ = AsyncSpec(mode=mode, max_staleness=k)
        with tempfile.TemporaryDirectory() as d:
            state = run(spec, Path(d), progress=False)
            rows = [json.loads(ln) for ln in (Path(d) / "metrics.jsonl").read_text().splitlines()]
        rows = rows[WARM_UP:] or rows
        step, gen, train = (
            _median(rows, "timing/step_s"),
            _median(rows, "timing/generate_s") + _median(rows, "timing/reward_s"),
            _median(rows, "timing/train_s") + _median(rows, "timing/sync_s"),
        )
        lag = max(r[POLICY_STALENESS_MAX] for r in rows)
        k3, cut, reward = (_median(rows, key) for key in (MISMATCH_K3, BEHAVIOUR_CORRECTED_FRAC, REWARD_MEAN))
        spread, d2 = (max(r.get(key, 0.0) for r in rows) for key in (MISMATCH_SPREAD_MAX, D2_RESIDUAL))
        print(
            f"{mode:<16}{step:>9.3f}{gen:>11.3f}{train:>9.3f}{step / max(gen, train):>10.2f}{lag:>9.0f}"
            f"{k3:>10.2e}{cut:>9.3f}{spread:>10.2e}{d2:>10.2e}{reward:>8.3f}  {state}"
        )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
