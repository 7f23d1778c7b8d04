"""Per-token gradients of rlcore's grpo, dr_grpo, dapo and gspo against TRL's GRPOTrainer loss, on identical tensors.

The same log-probs, old log-probs (off-policy, so that clipping acts), advantages and masks go to rlcore's
`Objective.loss` (this venv) and to TRL's own `GRPOTrainer._compute_loss` (TRL's venv, see vs_trl.py; its
model call replaced by the given log-probs). Both gradients are taken with respect to the per-token
log-probs, i.e. the weight each token's log-prob gets in the update. TRL settings that match each preset:

    grpo     loss_type=grpo     token ratio,    epsilon 0.2
    dr_grpo  loss_type=dr_grpo  token ratio,    epsilon 0.2, max_completion_length = the step's length
    dapo     loss_type=dapo     token ratio,    epsilon_low 0.2, epsilon_high 0.28
    gspo     loss_type=grpo     sequence ratio, epsilon_low 3e-4, epsilon_high 4e-4

    .venv/bin/python benchmarks/trl_loss_parity.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vs_trl import ensure_trl_venv  # noqa: E402  (benchmarks/vs_trl.py)

TRL_SETTINGS = {
    "grpo": {"loss_type": "grpo", "level": "token", "eps_low": 0.2, "eps_high": 0.2},
    "dr_grpo": {"loss_type": "dr_grpo", "level": "token", "eps_low": 0.2, "eps_high": 0.2},
    "dapo": {"loss_type": "dapo", "level": "token", "eps_low": 0.2, "eps_high": 0.28},
    "gspo": {"loss_type": "grpo", "level": "sequence", "eps_low": 3e-4, "eps_high": 4e-4},
}

_TRL_CHILD = r"""
import json, sys
from collections import defaultdict
from types import SimpleNamespace
import torch
from trl import GRPOTrainer

data = torch.load(sys.argv[1])
settings = json.loads(sys.argv[2])
out = {}
for name, s in settings.items():
    lp = data["logprobs"].clone().requires_grad_(True)

    class Loss:  # GRPOTrainer's own loss code, its model call replaced by the given log-probs
        _compute_loss = GRPOTrainer._compute_loss
        loss_type, importance_sampling_level = s["loss_type"], s["level"]
        epsilon_low, epsilon_high, beta = s["eps_low"], s["eps_high"], 0.0
        top_entropy_quantile, off_policy_mask_threshold, aux_loss_enabled, use_vllm = 1.0, None, False, False
        max_completion_length = data["logprobs"].shape[1]
        current_gradient_accumulation_steps = 1
        _entropy_bonus_enabled = False
        args = SimpleNamespace(delta=None, steps_per_generation=1, use_bias_correction_kl=False)
        accelerator = SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction="sum": x)
        model = SimpleNamespace(training=True)
        _metrics = {"train": defaultdict(list), "eval": defaultdict(list)}

        def _get_per_token_logps_and_entropies(self, *args, **kwargs):
            return lp, torch.zeros_like(lp), None

    mask = data["mask"]
    inputs = {"prompt_ids": torch.zeros(mask.shape[0], 1, dtype=torch.long), "prompt_mask": torch.ones(mask.shape[0], 1),
              "completion_ids": torch.zeros(mask.shape, dtype=torch.long), "completion_mask": mask,
              "advantages": data["advantages"], "old_per_token_logps": data["old"],
              "num_items_in_batch": mask.sum()}
    loss = Loss()._compute_loss(None, inputs)
    loss.backward()
    out[name] = lp.grad
torch.save(out, sys.argv[3])
"""


def make_inputs(B: int = 16, T: int = 24, seed: int = 0, noise: float = 0.3) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 3, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    logprobs = (-torch.rand(B, T, generator=gen, dtype=torch.float64) * 3) * mask
    old = (logprobs + torch.randn(B, T, generator=gen, dtype=torch.float64) * noise) * mask
    return {
        "logprobs": logprobs,
        "old": old,
        "mask": mask,
        "advantages": torch.randn(B, generator=gen, dtype=torch.float64),
        "group_ids": torch.arange(B) // 4,
    }


def rlcore_grads(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    import rlcore

    mask = data["mask"]
    B, T = mask.shape
    out = {}
    for name in TRL_SETTINGS:
        lp = data["logprobs"].clone().requires_grad_(True)
        norm = rlcore.StepNorm(tokens=float(mask.sum()), sequences=B, length=T, group_size=4)
        loss = (
            rlcore.get_objective(name)
            .loss(lp, data["old"], data["advantages"], mask, data["group_ids"], step=norm)
            .loss
        )
        out[name] = torch.autograd.grad(loss, lp)[0]
    return out


def main() -> None:
    py = ensure_trl_venv()
    # 0.3: ratios within 0.4-2.4; 1.0: far off-policy (0.04-17), both clip edges and large ratios exercised
    for noise in (0.3, 1.0):
        compare(py, make_inputs(noise=noise))


def compare(py: Path, data: dict[str, torch.Tensor]) -> None:
    ours = rlcore_grads(data)
    with tempfile.TemporaryDirectory() as d:
        torch.save(data, Path(d) / "in.pt")
        subprocess.run(
            [
                str(py),
                "-c",
                _TRL_CHILD,
                str(Path(d) / "in.pt"),
                json.dumps(TRL_SETTINGS),
                str(Path(d) / "out.pt"),
            ],
            check=True,
        )
        trl = torch.load(Path(d) / "out.pt")
    on = data["mask"].bool()
    ratio = (data["logprobs"] - data["old"]).exp()
    clipped = on & ((ratio < 0.8) | (ratio > 1.28))
    print(
        f"\n# per-token gradient d loss / d log p, rlcore vs TRL GRPOTrainer._compute_loss, float64, "
        f"{tuple(data['mask'].shape)} tokens ({int(on.sum())} on the mask), ratio range "
        f"{float(ratio[on].min()):.2f}-{float(ratio[on].max()):.2f}, {int(clipped.sum())} tokens outside "
        f"every preset's clip range"
    )
    print(f"{'objective':10s} {'max |diff|':>11s} {'max |grad|':>11s} {'tokens differing':>17s}")
    for name in TRL_SETTINGS:
        diff = (ours[name] - trl[name]).abs()
        print(
            f"{name:10s} {float(diff.max()):11.2e} {float(trl[name].abs().max()):11.2e} "
            f"{int((diff > 1e-12).sum()):17d}"
        )


if __name__ == "__main__":
    main()
