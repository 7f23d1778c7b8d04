"""Exact (enumerated) measurements of the tiny LM, taken every few steps of a run.

Rollout statistics are noisy; these are not: accuracy, reward-irrelevant choice probabilities and
equivalent-solution log-odds are computed by enumerating the task's first four slots for every prompt,
and probe drift (D5) by one forward pass over a fixed probe set against the frozen initial model.
"""

from __future__ import annotations

import torch

from experiments.tinylm.model import TinyLM
from experiments.tinylm.policy import head_distributions
from experiments.tinylm.task import SyntheticTask


def _logit(p: torch.Tensor) -> torch.Tensor:
    p = p.clamp(1e-7, 1 - 1e-7)
    return torch.log(p) - torch.log1p(-p)


class Probe:
    """Frozen reference for drift: the initial model's head distributions and probe-set predictions."""

    def __init__(self, task: SyntheticTask, model0: TinyLM, probe_tokens: torch.Tensor):
        self.task = task
        self.tokens = probe_tokens
        with torch.no_grad():
            self.logp0 = torch.log_softmax(model0(probe_tokens[:, :-1]), -1)
            self.head0 = head_distributions(model0, task)

    @torch.no_grad()
    def measure(self, model: TinyLM) -> dict[str, float]:
        task = self.task
        h = head_distributions(model, task)
        k = task.cfg.n_prompts
        correct = torch.as_tensor(task.correct, dtype=torch.long)  # (K, 2) answer indices
        is_ok = torch.zeros(k, 8)
        is_ok[torch.arange(k)[:, None], correct] = 1.0
        p_t, p_o, p_a, p_v = h["p_template"], h["p_opener"], h["p_answer"], h["p_verbose"]
        reach = p_t[:, :, None] * p_o  # (K, 4, 2) P(template, opener)
        p_correct = (p_a * is_ok[:, None, None, :]).sum(-1)  # (K, 4, 2)
        acc = (reach * p_correct).sum((1, 2))  # (K,)
        reach_a = reach[..., None] * p_a  # (K, 4, 2, 8)
        verbose = (reach_a * p_v).sum((1, 2, 3))
        # Equivalent-solution log-odds at the dominant prefix (T1, O1), and its change from step 0.
        pa0 = self.head0["p_answer"][:, 0, 0]
        pa = p_a[:, 0, 0]
        rows = torch.arange(k)

        def lo(p: torch.Tensor) -> torch.Tensor:
            return torch.log(p[rows, correct[:, 0]]) - torch.log(p[rows, correct[:, 1]])

        p_t0 = self.head0["p_template"]
        p_o0 = self.head0["p_opener"]
        logp = torch.log_softmax(model(self.tokens[:, :-1]), -1)
        kl = (logp.exp() * (logp - self.logp0)).sum(-1)  # KL(pi || pi_0) per probe position
        nxt = self.tokens[:, 1:]
        dlogp = (logp - self.logp0).gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
        tmpl_pos = 1  # position 1 predicts the probe's template
        return {
            "eval/accuracy": float(acc.mean()),
            "eval/p_template": float(p_t[:, 0].mean()),
            "eval/template_drift": float((_logit(p_t[:, 0]) - _logit(p_t0[:, 0])).abs().mean()),
            "eval/template_entropy": float(-(p_t * p_t.clamp_min(1e-12).log()).sum(1).mean()),
            "eval/opener_drift": float((_logit(p_o[:, 0, 0]) - _logit(p_o0[:, 0, 0])).abs().mean()),
            "eval/p_verbose": float(verbose.mean()),
            "eval/equiv_drift": float((lo(pa) - lo(pa0)).abs().mean()),
            "eval/equiv_logodds_abs": float(lo(pa).abs().mean()),
            "probe/kl": float(kl.mean()),
            "probe/kl_template": float(kl[:, tmpl_pos].mean()),
            "probe/dlogp": float(dlogp.mean()),
        }
