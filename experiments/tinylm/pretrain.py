"""Supervised "pretraining" of the tiny LM on the task's exact base distribution.

RL starts from this model, so the initial policy has the properties the experiment needs (a dominant
template token, reward-irrelevant 50/50 choices, wrong answers longer than right ones) without any
download. Targets are the exact next-token distributions, so a few hundred steps suffice. Checkpoints
are cached on disk by (task, model, seed, steps): every objective of a seed starts from the same weights,
which makes the comparison between objectives paired.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from experiments.paths import CACHE
from experiments.tinylm.model import ModelConfig, TinyLM
from experiments.tinylm.task import SyntheticTask

DEFAULT_CACHE = CACHE / "tinylm"


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 600
    batch: int = 256
    probe_fraction: float = 0.25
    lr: float = 3e-3
    seed: int = 0


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over positions with a target of the cross-entropy to an exact target distribution."""
    has = targets.sum(-1) > 0
    ce = -(targets * torch.log_softmax(logits, -1)).sum(-1)
    return ce[has].mean()


def pretrain(task: SyntheticTask, mcfg: ModelConfig, pcfg: PretrainConfig) -> tuple[TinyLM, list[float]]:
    """Train from random init; returns the model and its loss curve (excess over the targets' entropy)."""
    torch.manual_seed(pcfg.seed)
    rng = np.random.default_rng(10_000 + pcfg.seed)
    model = TinyLM(mcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=pcfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=pcfg.lr, total_steps=pcfg.steps, pct_start=0.1)
    n_probe = int(round(pcfg.batch * pcfg.probe_fraction))
    curve = []
    for _ in range(pcfg.steps):
        tok, tgt = task.sample_base(pcfg.batch - n_probe, rng)
        ptok, ptgt = task.sample_probes(n_probe, rng)
        loss = soft_cross_entropy(model(tok[:, :-1]), tgt) + soft_cross_entropy(model(ptok[:, :-1]), ptgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        curve.append(float(loss.detach()))
    return model, curve


def pretrained(
    task: SyntheticTask, mcfg: ModelConfig, pcfg: PretrainConfig, cache_dir: Path | None = DEFAULT_CACHE
) -> TinyLM:
    """The pretrained model for this configuration, from the disk cache when it is there."""
    if cache_dir is None:
        return pretrain(task, mcfg, pcfg)[0]
    key = hashlib.sha256(json.dumps([asdict(task.cfg), asdict(mcfg), asdict(pcfg)], sort_keys=True).encode())
    path = Path(cache_dir) / f"tinylm-{key.hexdigest()[:16]}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    # Study workers run in parallel: the first to need a seed trains it, the others wait and load it.
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            model, _ = pretrain(task, mcfg, pcfg)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            torch.save(model.state_dict(), tmp)
            tmp.replace(path)
    model = TinyLM(mcfg)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model
