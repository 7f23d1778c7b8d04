"""KL-to-reference estimators on sampled tokens (Schulman, joschu.net/blog/kl-approx.html; docs/objectives.md#kl-and-entropy-terms)."""

from __future__ import annotations

import torch
from torch import Tensor

MAX_LOG_RATIO = 20.0  # verl's low_var_kl clamp; keeps exp() finite


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """Per-token KL(pi || ref) estimate: k1 = log(pi/ref), k2 = (log(pi/ref))^2/2, k3 = ref/pi - log(ref/pi) - 1."""
    d = logprobs - ref_logprobs
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    d = d.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(-d) + d - 1.0
