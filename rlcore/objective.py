"""The objective: advantages, per-token loss and its metrics for one resolved config.

Every objective has the gradient  g = sum_{i,t} w[i,t] psi[i,t],  w = kappa * A  (docs/objectives.md#per-token-weights).
The loss is the objective's surrogate (token ratios with gradient and a clamp-form gate; sequence-level
and truncated IS weights as stop-gradient coefficients times log pi, keeping the surrogate's value), so
autograd gives exactly the closed-form weights of docs/objectives.md#presets (tests/rlcore/test_weights.py), and
`w = -dloss/dlogprobs` is what the diagnostics read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rlcore import gates, ratios
from rlcore.advantages import Shaping, group_advantages
from rlcore.aggregation import sequence_coefficients
from rlcore.config import ObjectiveConfig, cancellation_condition, cancellation_verdict, knob_doc
from rlcore.groups import GroupIndex
from rlcore.kl import kl_estimate
from rlcore.offpolicy import BehaviourCoefficient, behaviour_coefficient
from rlcore.presets import PRESETS, resolve
from rlcore.step import StepNorm
from rlcore.transforms import advantage_reweighting, lopti_stages, min_replace, orth
from rlcore.validation import as_mask, bool_to_float, check_finite, check_group_ids, check_tensor


@dataclass
class LossOutput:
    """loss: scalar to minimise (pg + kl_coef * kl - entropy_coef * entropy); it *is* `pg_loss` (the same
    tensor) when the objective has no KL/entropy term. pg_loss: the policy-gradient term alone, whose
    gradient is the one that must cancel. clipped: (B, T) bool, tokens whose gradient the gate removed
    (for ratio='truncated' without a gate: tokens whose IS weight was truncated), padding included;
    None without a gate. metrics: floats for logging (loss/*, ratio/mean, clip/frac[_pos|_neg],
    kl/mean, tokens)."""

    loss: Tensor
    pg_loss: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    clipped: Tensor | None = None


@dataclass(frozen=True)
class _Prepared:
    """One call's inputs after `Objective._prepare`: checked, detached where no gradient may flow, in the
    loss's dtype (float32 for bf16/fp16 log-probs)."""

    batch_size: int
    dtype: torch.dtype
    lp: Tensor  # (B, T) log-probs under the current policy, with gradient
    old: Tensor  # (B, T) log-probs under the sampling policy
    adv: Tensor  # (B,) or (B, T) advantages
    mask: Tensor  # (B, T) 0/1 response tokens
    stage: Tensor  # (B, T) 0/1 tokens of this update stage; the same object as `mask` without a stage mask
    n_stage: Tensor  # number of tokens in `stage`
    lengths: Tensor  # (B,) response lengths l_i (row sums of `mask`)
    group_ids: Tensor  # (B,)
    ref: Tensor | None  # (B, T) reference log-probs when the loss has a KL term
    ent: Tensor | None  # (B, T) entropies with gradient when the loss has an entropy bonus
    agg: Tensor  # (B,) aggregation coefficients c_i: the loss is sum_i c_i sum_t term[i,t]
    step: StepNorm | None  # totals of the whole optimizer step, when the caller split it
    behaviour: BehaviourCoefficient | None  # the behaviour correction's coefficient, when the config has one


class Objective:
    """A named composition of knobs (see `rlcore.config.ObjectiveConfig`). Stateless; safe to share."""

    def __init__(self, name: str, config: ObjectiveConfig) -> None:
        self.name = name
        self.config = config
        self._preserves, self._reasons = cancellation_verdict(config)

    # -- properties -------------------------------------------------------------------------------
    @property
    def preserves_cancellation(self) -> bool:
        """True iff policy-gradient weights cancel on group-common nodes for any ratio (`cancellation_verdict`)."""
        return self._preserves

    @property
    def needs_whole_groups(self) -> bool:
        """DFPO transforms couple a group's responses: whole groups per call, or `seq_weights`."""
        return self.config.seq_transform != "none"

    @property
    def needs_reference(self) -> bool:
        """The loss has a KL term: every call needs the frozen reference policy's log-probs (`ref_logprobs`)."""
        return self.config.kl_coef > 0

    @property
    def needs_entropies(self) -> bool:
        """The loss has an entropy bonus: every call needs per-position entropies with their gradient."""
        return self.config.entropy_coef != 0

    @property
    def stage_count(self) -> int:
        """Update stages per rollout batch (`stages()`): 2 with Lopti's split, else 1."""
        return 2 if self.config.lopti_eta != 0 else 1

    def describe(self) -> str:
        cfg = self.config
        head = PRESETS[self.name].summary if self.name in PRESETS else "custom objective"
        verdict = (
            "preserves cancellation on group-common nodes"
            if self._preserves
            else "does not preserve cancellation: " + "; ".join(self._reasons)
        )
        condition = cancellation_condition(cfg)
        if self._preserves and condition is not None:
            verdict += f" when {condition}"
        lines = [f"{self.name}: {head}", f"  {verdict}"]
        for name, value in cfg.as_dict().items():
            lines.append(f"  {name} = {value!r}  -- {knob_doc(name)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Objective({self.name!r}, preserves_cancellation={self._preserves})"

    # -- advantages and stages --------------------------------------------------------------------
    def advantages(
        self,
        rewards: Tensor,
        group_ids: Tensor,
        mask: Tensor,
        *,
        bonus: Tensor | None = None,
        shaping: Shaping | None = None,
        keep: Tensor | None = None,
    ) -> Tensor:
        """(B,) group advantages of the whole step (see `rlcore.advantages.group_advantages`); keep: the
        responses that enter the centring (filter before centring, e.g. ~truncated)."""
        return group_advantages(
            rewards, group_ids, mask, self.config, bonus=bonus, shaping=shaping, keep=keep
        )

    def stages(self, old_logprobs: Tensor, mask: Tensor) -> list[Tensor]:
        """Token masks of the update stages, in order: [mask] normally; Lopti's two stages otherwise.

        A learner runs its full update (all mini-batches) once per stage with `loss(..., stage_mask=s)`;
        normalisers stay those of the full mask, so the stage losses sum to the one-stage loss.
        """
        check_tensor("old_logprobs", old_logprobs, ndim=2)
        check_tensor("mask", mask, tuple(old_logprobs.shape), kind="mask")
        return lopti_stages(old_logprobs, mask, self.config.lopti_eta)

    def sequence_weights(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        group_ids: Tensor,
        *,
        step: StepNorm | None = None,
    ) -> Tensor:
        """(B,) transformed per-response weights of a DFPO objective, for the whole step.

        When a step's groups are split across micro-batches, compute these once over the whole step
        (no_grad forward; parameters do not change between micro-batches of one step), slice them like
        the batch and pass them to `loss(..., seq_weights=...)`.
        """
        if not self.needs_whole_groups:
            raise ValueError(
                f"objective {self.name!r} has no seq_transform; sequence_weights is for DFPO presets"
            )
        with torch.no_grad():
            p = self._prepare(
                logprobs,
                old_logprobs,
                advantages,
                mask,
                group_ids,
                None,
                step,
                None,
                None,
                regularisers=False,
            )
            return self._transformed_weights(p, GroupIndex.of(group_ids), check=True)

    # -- loss -------------------------------------------------------------------------------------
    def loss(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        group_ids: Tensor,
        ref_logprobs: Tensor | None = None,
        *,
        step: StepNorm | None = None,
        stage_mask: Tensor | None = None,
        entropies: Tensor | None = None,
        seq_weights: Tensor | None = None,
        behaviour_logprobs: Tensor | None = None,
    ) -> LossOutput:
        """Loss of one (micro-)batch.

        logprobs (B, T): log-probs of the sampled tokens under the current policy (requires grad).
        old_logprobs (B, T): the same under the sampling policy. advantages: (B,) or (B, T).
        mask (B, T): response tokens (bool or 0/1). group_ids (B,): integer group of each response.
        ref_logprobs (B, T): reference policy, required when kl_coef > 0.
        step: totals of the whole optimizer step when it is split into micro-batches/ranks; then the
            micro-batch losses sum exactly to the full-batch loss (and so do their gradients).
        stage_mask (B, T): one of `stages()`; only these tokens get policy/KL/entropy terms.
        entropies (B, T): per-position policy entropy with gradient, required when entropy_coef != 0.
        seq_weights (B,): precomputed `sequence_weights` slice for DFPO objectives split mid-group.
        behaviour_logprobs (B, T): the sampling engine's log-probs, required when behaviour_correction is set
            (ignored otherwise); each token's term gets the stop-gradient coefficient of rlcore.offpolicy.
        """
        cfg = self.config
        p = self._prepare(
            logprobs,
            old_logprobs,
            advantages,
            mask,
            group_ids,
            ref_logprobs,
            step,
            stage_mask,
            entropies,
            behaviour_logprobs=behaviour_logprobs,
        )
        coef = p.agg
        ratio_kind = cfg.ratio
        if self.needs_whole_groups:
            if seq_weights is None:
                coef = self._transformed_weights(p, GroupIndex.of(p.group_ids), check=True)
            else:
                check_tensor("seq_weights", seq_weights, (p.batch_size,))
                check_finite("seq_weights", seq_weights)
                coef = seq_weights.detach().to(p.dtype)
            if ratio_kind in ("sequence", "geo_mean"):  # the sequence IS factor now lives in coef
                ratio_kind = "none"
        elif seq_weights is not None:
            raise ValueError(f"seq_weights: objective {self.name!r} has no seq_transform; drop the argument")

        tok, clipped, ratio_detached, value_rows = self._policy_terms(p, ratio_kind)
        ms = p.stage
        rows = (tok * ms).sum(1)
        if value_rows is not None:  # report the surrogate's value, keep the stop-gradient form's gradient
            rows = rows - rows.detach() + value_rows
        pg = torch.dot(rows, coef)
        total = pg
        scalars: dict[str, Tensor] = {"loss/pg": pg.detach()}
        if p.ref is not None:  # kl_coef > 0 (_prepare refuses a missing reference)
            kl_tok = kl_estimate(p.lp, p.ref, cfg.kl_estimator)
            kl_rows = (kl_tok * ms).sum(1)
            kl = torch.dot(kl_rows, p.agg)
            total = total + cfg.kl_coef * kl
            scalars["loss/kl"] = kl.detach()
            scalars["kl/mean"] = kl_rows.detach().sum() / p.n_stage
        if p.ent is not None:  # entropy_coef != 0
            ent = torch.dot((p.ent * ms).sum(1), p.agg)
            total = total - cfg.entropy_coef * ent
            scalars["loss/entropy"] = ent.detach()
        scalars["loss/total"] = total.detach()
        if ratio_detached is not None:
            scalars["ratio/mean"] = torch.dot(ratio_detached.flatten(), ms.flatten()) / p.n_stage
        if clipped is not None:
            scalars.update(self._clip_metrics(clipped, p))
        if p.behaviour is not None:  # share of tokens whose behaviour IS weight was truncated or masked
            corrected = bool_to_float(p.behaviour.corrected.expand_as(ms).contiguous(), ms.dtype)
            scalars["behaviour/corrected_frac"] = (corrected * ms).sum() / p.n_stage
            scalars["behaviour/coef_mean"] = (p.behaviour.coef.expand_as(ms) * ms).sum() / p.n_stage
        metrics = dict(zip(scalars, torch.stack(list(scalars.values())).tolist(), strict=True))
        metrics["tokens"] = float(p.n_stage)
        return LossOutput(loss=total, pg_loss=pg, metrics=metrics, clipped=clipped)

    # -- internals --------------------------------------------------------------------------------
    def _prepare(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        group_ids: Tensor,
        ref_logprobs: Tensor | None,
        step: StepNorm | None,
        stage_mask: Tensor | None,
        entropies: Tensor | None,
        *,
        regularisers: bool = True,
        behaviour_logprobs: Tensor | None = None,
    ) -> _Prepared:
        """Check one call's inputs and cast them to the loss's dtype (regularisers=False: skip KL/entropy and
        the behaviour correction, which the DFPO sequence weights do not read)."""
        cfg = self.config
        check_tensor("logprobs", logprobs, ndim=2)
        shape = tuple(logprobs.shape)
        batch, width = shape
        if batch == 0 or width == 0:
            raise ValueError(f"logprobs: empty batch of shape {shape}")
        check_tensor("old_logprobs", old_logprobs, shape)
        check_tensor("advantages", advantages, ndim=(1, 2))
        if advantages.shape[0] != batch or (advantages.ndim == 2 and tuple(advantages.shape) != shape):
            raise ValueError(
                f"advantages: expected shape ({batch},) or {shape}, got {tuple(advantages.shape)}"
            )
        group_ids = check_group_ids(group_ids, batch)
        # bf16/fp16 log-probs are upcast: sums over thousands of tokens need fp32 accuracy
        dtype = torch.float32 if logprobs.dtype in (torch.bfloat16, torch.float16) else logprobs.dtype
        lp = logprobs.to(dtype)
        old = old_logprobs.detach().to(dtype)
        adv = advantages.detach().to(dtype)
        for name, x in (("logprobs", lp.detach()), ("old_logprobs", old), ("advantages", adv)):
            check_finite(name, x)
        mf = as_mask("mask", mask, shape, dtype)
        lengths = mf.sum(1)
        ms, n_ms = mf, None
        if stage_mask is not None:
            ms = as_mask("stage_mask", stage_mask, shape, dtype)
            if bool((ms > mf).any()):
                raise ValueError(
                    "stage_mask: selects tokens outside mask; use a mask from objective.stages()"
                )
            n_ms = ms.sum()
        n_tok = lengths.sum()
        if not n_tok > 0:
            raise ValueError("mask: selects no tokens; every (micro-)batch needs at least one response token")
        ref = ent = behaviour = None
        if self.needs_reference and regularisers:
            ref = self._required(
                "ref_logprobs",
                ref_logprobs,
                shape,
                dtype,
                f"kl_coef={cfg.kl_coef}",
                "pass the reference policy's log-probs or set kl_coef=0",
            ).detach()
        if self.needs_entropies and regularisers:  # keeps its graph: the entropy bonus has a gradient
            ent = self._required(
                "entropies",
                entropies,
                shape,
                dtype,
                f"entropy_coef={cfg.entropy_coef}",
                "pass per-position entropies or set entropy_coef=0",
            )
        agg = sequence_coefficients(cfg, lengths, step, width)
        if cfg.behaviour_correction != "none" and regularisers:
            beh = self._required(
                "behaviour_logprobs",
                behaviour_logprobs,
                shape,
                dtype,
                f"behaviour_correction={cfg.behaviour_correction!r}",
                "pass the sampling engine's log-probs or set it to 'none'",
            ).detach()
            behaviour = behaviour_coefficient(old, beh, mf, lengths, cfg)
        return _Prepared(
            batch_size=batch,
            dtype=dtype,
            lp=lp,
            old=old,
            adv=adv,
            mask=mf,
            stage=ms,
            n_stage=n_tok if n_ms is None else n_ms,
            lengths=lengths,
            group_ids=group_ids,
            ref=ref,
            ent=ent,
            agg=agg,
            step=step,
            behaviour=behaviour,
        )

    def _required(
        self, name: str, x: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, knob: str, fix: str
    ) -> Tensor:
        """An input the config's `knob` needs: present, of `shape`, finite, in the loss's dtype."""
        if x is None:
            raise ValueError(f"{name}: required because objective {self.name!r} has {knob}; {fix}")
        check_tensor(name, x, shape)
        out = x.to(dtype)
        check_finite(name, out.detach())
        return out

    def _policy_terms(
        self, p: _Prepared, ratio_kind: str
    ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """Per-token loss terms, the gate's clipped mask, the detached token ratio (for metrics) and, where
        the terms are in stop-gradient form, the row sums of the true surrogate value (else None)."""
        cfg = self.config
        adv = p.adv if p.adv.ndim == 2 else p.adv[:, None]  # signs for the gates: (B, 1) or (B, T)
        coef_adv = adv
        if cfg.ar_alpha > 0:  # AR, arXiv 2505.12929: node-local, positive, so sign(A~) = sign(A)
            coef_adv = advantage_reweighting(p.old, cfg.ar_alpha).mul_(adv)
        if (
            p.behaviour is not None
        ):  # decoupled: stop-gradient c >= 0 on top of the ratio to pi_old; sign kept
            coef_adv = coef_adv * p.behaviour.coef
        lp = p.lp
        logr = lp - p.old
        if ratio_kind == "token":
            r = ratios.token_ratio(logr)
            gated, clipped = gates.gate_ratio(r, adv, cfg)
            return -coef_adv * gated, clipped, r.detach(), None
        if ratio_kind == "sequence":  # GSPO: the gate acts on s_i (sequence-level, sign-dependent for ppo)
            return self._sequence_terms(p, adv, coef_adv, lp)
        if ratio_kind == "geo_mean":  # GMPO: clip inside, in log space, then the geometric mean
            logr_c, clipped = gates.log_space_clip(logr, adv, cfg)
            s = ratios.geo_mean_ratio(logr_c, p.mask, p.lengths)
            return -coef_adv * s, clipped, None, None
        # stop-gradient coefficient forms: loss = -sg(k) * log pi, gradient exactly k
        if cfg.gate == "none" and ratio_kind != "truncated":
            return -coef_adv * lp, None, None, None
        r = torch.exp(logr.detach())
        k, clipped = coef_adv, None
        if ratio_kind == "truncated":  # CISPO, arXiv 2506.13585
            q = ratios.truncated_weight(r, cfg.is_min, cfg.is_max)
            k = coef_adv * q
            clipped = q != r
        live = gates.gate_mask(r, adv, cfg)
        if live is not None:  # a gate's decisions supersede the truncation flags in `clipped`
            k = k * bool_to_float(live, k.dtype)
            clipped = ~live
        return -k * lp, clipped, r, None

    def _sequence_terms(
        self, p: _Prepared, adv: Tensor, coef_adv: Tensor, lp: Tensor
    ) -> tuple[Tensor, Tensor | None, None, Tensor]:
        """GSPO (arXiv 2507.18071 Eq. 5) without (B, T) ratio tensors: d s_i / d logp[i,t] = s_i / l_i and the
        1/l_i comes from the aggregation, so a token's weight is sg(A s_i gate(s_i)). Also returns the row
        sums of GSPO's surrogate -min(s A, clip(s) A), so the loss keeps GSPO's value."""
        s = torch.exp(ratios.sequence_log_ratio(p.lp - p.old, p.mask, p.lengths))[:, None]
        gated, clipped = gates.gate_ratio(s, adv, self.config)  # (B, 1) unless adv is per token
        k = coef_adv * s if clipped is None else coef_adv * s * ~clipped
        value = -coef_adv * gated
        ms = p.stage
        if value.shape[1] == 1:
            value_rows = value[:, 0] * (p.lengths if ms is p.mask else ms.sum(1))
        else:
            value_rows = (value * ms).sum(1)
        clipped = None if clipped is None else clipped.expand_as(lp)
        return -k * lp, clipped, None, value_rows

    def _transformed_weights(self, p: _Prepared, groups: GroupIndex, check: bool) -> Tensor:
        """DFPO: per-response weight v_i = c_i * u_i (u_i = s_i for sequence ratios), transformed per group."""
        cfg = self.config
        if check:
            step = p.step
            want = step.group_size if step is not None else None
            counts = groups.counts
            bad = (counts != want) if want is not None else (counts < 2) | (counts != counts[0])
            if bool(bad.any()):
                expected = f"{want} responses" if want is not None else "equal sizes >= 2"
                raise ValueError(
                    f"group_ids: objective {self.name!r} (seq_transform={cfg.seq_transform!r}) couples the responses "
                    f"of a group, so each call must hold whole groups ({expected}); got {groups.describe_sizes()}. "
                    "Keep whole groups in one micro-batch, or pass seq_weights=objective.sequence_weights(...) "
                    "computed over the whole step"
                )
        v = p.agg
        if cfg.ratio in ("sequence", "geo_mean"):
            logr = (p.lp - p.old).detach()
            v = v * torch.exp(ratios.sequence_log_ratio(logr, p.mask, p.lengths))
        if cfg.seq_transform == "min_replace":
            return min_replace(v, groups)
        adv = p.adv if p.adv.ndim == 1 else (p.adv * p.mask).sum(1) / p.lengths.clamp_min(1)
        return orth(v, adv, groups)

    @staticmethod
    def _clip_metrics(clipped: Tensor, p: _Prepared) -> dict[str, Tensor]:
        """Clip fractions overall and by sign of A (diagnostic D10, verl pg_clipfrac / clipfrac_lower)."""
        ms = p.stage
        n_rows = ms.sum(1) if ms is not p.mask else p.lengths
        if clipped.stride(1) == 0:  # a sequence-level gate: one decision per response
            rows = clipped[:, 0].to(ms.dtype) * n_rows
        else:
            rows = bool_to_float(clipped.contiguous(), ms.dtype).mul_(ms).sum(1)
        adv = p.adv if p.adv.ndim == 1 else (p.adv * p.mask).sum(1)
        pos, neg = adv > 0, adv < 0
        return {
            "clip/frac": rows.sum() / p.n_stage,
            "clip/frac_pos": (rows * pos).sum() / (n_rows * pos).sum().clamp_min(1),
            "clip/frac_neg": (rows * neg).sum() / (n_rows * neg).sum().clamp_min(1),
        }


def get_objective(name: str, **overrides: Any) -> Objective:
    """The preset `name` with knob overrides; ValueError names valid presets/knobs/values."""
    return Objective(name, resolve(name, overrides))
