"""rlcore: GRPO-family objectives, group advantages and token-gradient-cancellation diagnostics.

Torch (plus numba-compiled host loops for the diagnostics), no Ray, no I/O. Tensors in, loss and metrics out:

    import rlcore
    obj = rlcore.get_objective("cp_grpo", ar_alpha=0.3)     # preset + knob overrides (rlcore.config)
    adv = obj.advantages(rewards, group_ids, mask)           # once per optimizer step, whole step
    out = obj.loss(logprobs, old_logprobs, adv, mask, group_ids)
    out.loss.backward(); out.metrics; obj.preserves_cancellation; print(obj.describe())

A learner that splits one optimizer step into micro-batches / ranks:

    step = rlcore.StepNorm(tokens=..., sequences=..., length=..., group_size=G)   # whole-step totals
    for stage in obj.stages(old_logprobs, mask):             # [mask], or Lopti's two token stages
        for micro in micro_batches:                          # sum of micro losses == full-batch loss
            out = obj.loss(lp, old, adv, mask, gids, ref, step=step, stage_mask=stage[micro])
    # DFPO presets (obj.needs_whole_groups) couple a group's responses: keep whole groups per call, or
    # pass seq_weights=obj.sequence_weights(...)[micro] computed once over the whole step.

Diagnostics without a second loss evaluation (rlcore.diagnostics):

    w, out = rlcore.ascent_weights(obj, lp, old, adv, mask, gids, of="loss")    # detached leaf
    lp.backward(-w)                                          # same parameter gradient as out.loss
    metrics = rlcore.cancellation_diagnostics(w, token_ids, mask, gids, adv, old_logprobs=old,
                                              entropies=ent, clipped=out.clipped)   # diag/d1_gcpr, ...
    # with KL/entropy terms, read the diagnostics from of="pg" weights: regularisers are not meant to cancel
    step_metrics = rlcore.pool_diagnostics([(metrics_mb, groups_mb), ...])   # one step from its micro-batches

Off-policy batches (rlcore.offpolicy): the engine's sampling log-probs enter the loss as a stop-gradient
coefficient when the config has a `behaviour_correction` (token-level ones keep cancellation when copies of a
shared token carry equal behaviour log-probs); `offpolicy.behaviour_mismatch` measures that spread and the k3 KL:

    out = obj.loss(lp, old, adv, mask, gids, behaviour_logprobs=engine_lp)

The math of every objective and knob is in docs/objectives.md, the diagnostics in docs/diagnostics.md.

Importing rlcore and calling `list_objectives()` / `resolve()` does not import torch (the control plane
validates objective names with them); torch-dependent parts load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlcore.config import (
    RESIDUAL_TOLERANCE,
    ObjectiveConfig,
    TrajectoryCredit,
    cancellation_verdict,
    describe_knobs,
)
from rlcore.pooling import pool_diagnostics, pooling_terms
from rlcore.presets import PRESETS, list_objectives, preserves_cancellation, resolve
from rlcore.step import StepNorm

if TYPE_CHECKING:  # pragma: no cover
    from rlcore.diagnostics import ascent_weights, cancellation_diagnostics
    from rlcore.objective import LossOutput, Objective, get_objective

__all__ = [
    "PRESETS",
    "RESIDUAL_TOLERANCE",
    "LossOutput",
    "Objective",
    "ObjectiveConfig",
    "StepNorm",
    "TrajectoryCredit",
    "ascent_weights",
    "cancellation_diagnostics",
    "cancellation_verdict",
    "describe_knobs",
    "get_objective",
    "list_objectives",
    "pool_diagnostics",
    "pooling_terms",
    "preserves_cancellation",
    "resolve",
]

_LAZY = {
    "get_objective": "rlcore.objective",
    "Objective": "rlcore.objective",
    "LossOutput": "rlcore.objective",
    "ascent_weights": "rlcore.diagnostics",
    "cancellation_diagnostics": "rlcore.diagnostics",
}
_LAZY_MODULES = {
    "diagnostics",
    "objective",
    "advantages",
    "ratios",
    "gates",
    "aggregation",
    "transforms",
    "kl",
    "validation",
    "groups",
    "offpolicy",
}


def __getattr__(name: str) -> Any:
    # Lazy: `import rlcore` stays torch-free, so the control plane can validate objectives without torch.
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f"rlcore.{name}")
    raise AttributeError(f"module 'rlcore' has no attribute {name!r}")
