"""IBPO inside the trainer's step (the `ibpo` section of the job spec; docs/ibpo.md).

After a step's groups are sampled and scored, every incorrect response of a group that also holds a correct
one is shown to the policy again with a correct sibling and revised: one batched generate() through the job's
own rollout replicas (the weights, temperature and top_p that sampled the step), scored by the job's own
reward pool. A revision the verifier accepts gives its response phi = rho; the batch's advantages are those of
R' = R + lambda * phi, centred per group (rlcore.ibpo), optionally with the edit mask. Revisions are not trained
on. Time and tokens of the pass count in the step's `timing/generate_s` / `timing/reward_s` and the replicas'
token counters, and are reported on their own as `ibpo/...`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlcore import ibpo as core
from tgc_rl.batch import SampledBatch, TrainBatch
from tgc_rl.config import JobSpec
from tgc_rl.rollout.engine import Sampling
from tgc_rl.tasks import TaskItem
from tgc_rl.tasks.params import fill_template
from tgc_rl.trainer.data import derive_seed, encode_item
from tgc_rl.trainer.groups import Group

log = logging.getLogger("tgc.trainer")

_SEED_SALT = 0x69627030  # revision sampling seeds never coincide with training or evaluation ones
_REFERENCE_SEPARATOR = "\n\n---\n\n"


@dataclass
class GroupRevisions:
    """The IBPO outcome of one group, per response (in the group's order)."""

    phi: list[float]
    attempted: list[bool]
    revised_correct: list[bool]
    edits: list[np.ndarray | None]  # edit mask of a repaired response (when a mask is on), else None

    @classmethod
    def empty(cls, n: int) -> GroupRevisions:
        return cls([0.0] * n, [False] * n, [False] * n, [None] * n)


@dataclass
class _Job:
    group: int
    row: int
    prompt_ids: list[int]
    item: TaskItem
    seed: int


class Reviser:
    """Generates and scores a step's revisions and turns them into the batch's advantages."""

    def __init__(self, spec: JobSpec, tokenizer: Any, objective: Any):
        if spec.ibpo is None:
            raise ValueError("the job spec has no `ibpo` section")
        self.spec, self.cfg, self.tokenizer, self.objective = spec, spec.ibpo, tokenizer, objective
        self.lam = self.cfg.lambda_ if self.cfg.lambda_ is not None else objective.config.bonus_coef
        s = spec.sampling
        self.sampling = Sampling(s.temperature, s.top_p, self.cfg.max_new_tokens or s.max_new_tokens)
        self.preserves, self.reasons = core.verdict(objective.config, self.cfg.mask)
        log.info(
            "IBPO: rho %.3g, lambda %.3g, %d reference(s), mask %s: %s",
            self.cfg.rho,
            self.lam,
            self.cfg.references,
            self.cfg.mask,
            "preserves cancellation" if self.preserves else "breaks cancellation: " + "; ".join(self.reasons),
        )

    # -- generation -----------------------------------------------------------------------------------
    def revision_prompt(self, item: TaskItem, response: str, references: list[str]) -> list[int]:
        """Token ids of the revision prompt: the template as the user turn, through the model's chat template
        (and system prompt) like a task prompt."""
        text = fill_template(
            self.cfg.revision_template,
            prompt=item.prompt,
            response=response,
            references=_REFERENCE_SEPARATOR.join(references),
        )
        return encode_item(self.tokenizer, self.spec.model, TaskItem(id=item.id, prompt=text))

    def after_rollout(
        self, groups: list[Group], rollout: Any, rewards: Any, metrics: dict[str, float]
    ) -> None:
        """Revise and score the incorrect responses of `groups` (each gets its GroupRevisions as `.credit`); adds
        `ibpo/...` to `metrics` and the pass's seconds to its `timing/generate_s` and `timing/reward_s`."""
        t0 = time.perf_counter()
        jobs, eligible, skipped = self._jobs(groups)
        outs, scores = [], []
        t1 = time.perf_counter()
        if jobs:
            outs = [
                cs[0]
                for cs in rollout.generate(
                    [j.prompt_ids for j in jobs], 1, [j.seed for j in jobs], self.sampling
                )
            ]
        t2 = time.perf_counter()
        if jobs:
            texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in outs]
            scores = rewards.score([j.item for j in jobs], texts)
        t3 = time.perf_counter()
        repaired, edited = 0, []
        for j, out, score in zip(jobs, outs, scores, strict=True):
            rec = _revisions(groups[j.group])
            ok = score.correct
            rec.attempted[j.row], rec.revised_correct[j.row] = True, ok
            if ok:
                repaired += 1
                rec.phi[j.row] = self.cfg.rho
                if self.cfg.mask != "none":
                    edit = core.edit_mask(groups[j.group].completions[j.row].token_ids, out.token_ids)
                    rec.edits[j.row] = edit
                    edited.append(float(edit.mean()) if edit.size else 0.0)
        phis = [p for g in groups for p in _revisions(g).phi]
        gen_s, reward_s = t2 - t1, t3 - t2
        metrics["timing/generate_s"] = metrics.get("timing/generate_s", 0.0) + gen_s + (t1 - t0)
        metrics["timing/reward_s"] = metrics.get("timing/reward_s", 0.0) + reward_s
        metrics.update(
            {
                "ibpo/eligible_groups": float(eligible),
                "ibpo/revisions": float(len(jobs)),
                "ibpo/skipped_too_long": float(skipped),
                "ibpo/repaired": float(repaired),
                "ibpo/success_rate": repaired / len(jobs) if jobs else 0.0,
                "ibpo/phi_mean": sum(phis) / max(len(phis), 1),
                "ibpo/tokens": float(sum(len(c.token_ids) for c in outs)),
                "ibpo/revision_length_mean": sum(len(c.token_ids) for c in outs) / max(len(outs), 1),
                "ibpo/generate_s": gen_s + (t1 - t0),
                "ibpo/reward_s": reward_s,
                "ibpo/reward_timeouts": float(sum(s.status == "timeout" for s in scores)),
                "ibpo/reward_errors": float(sum(s.status == "error" for s in scores)),
                "ibpo/edited_frac_mean": sum(edited) / len(edited) if edited else 0.0,
            }
        )

    def _jobs(self, groups: list[Group]) -> tuple[list[_Job], int, int]:
        jobs: list[_Job] = []
        eligible = skipped = 0
        limit = self.spec.sampling.max_prompt_tokens
        for gi, g in enumerate(groups):
            g.credit = GroupRevisions.empty(len(g.completions))
            correct = [s.correct for s in g.scores]
            refs = [j for j, c in enumerate(correct) if c]
            if not refs or len(refs) == len(correct):
                continue
            eligible += 1
            texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in g.completions]
            k = min(self.cfg.references, len(refs))
            for i, ok in enumerate(correct):
                if ok:
                    continue
                # rotate through the correct siblings, so the incorrect responses of a group see different ones
                chosen = [texts[refs[(i + r) % len(refs)]] for r in range(k)]
                ids = self.revision_prompt(g.prompt.item, texts[i], chosen)
                if len(ids) > limit:
                    skipped += 1
                    continue
                seed = derive_seed(self.spec.seed, g.prompt.index, i * 104_729 + _SEED_SALT)
                jobs.append(_Job(gi, i, ids, g.prompt.item, seed))
        return jobs, eligible, skipped

    # -- the batch ------------------------------------------------------------------------------------
    def train_batch(self, groups: list[Group], batch: SampledBatch) -> tuple[TrainBatch, dict[str, float]]:
        """The batch with its shaped (B,) advantages and, with a mask on, the credit mask; and `ibpo/...` metrics
        of the credit: D1/D2 of the first on-policy pass for the trained mask and the other variants too."""
        recs = [_revisions(g) for g in groups]
        phi = torch.tensor([p for r in recs for p in r.phi], dtype=torch.float32)
        edits = [e for r in recs for e in r.edits]
        mask, gids, tokens = batch.response_mask, batch.group_ids, batch.response_ids
        adv = core.shaped_advantages(self.objective.config, batch.rewards, gids, mask, phi, self.lam)
        variants = ("none", "naive", "symmetric") if self.cfg.mask != "none" else ("none",)
        metrics: dict[str, float] = {
            "ibpo/lambda": float(self.lam),
            "ibpo/preserves_cancellation": float(self.preserves),
        }
        credit = None
        for variant in variants:
            c = core.credit_mask(variant, edits, tokens, mask, gids)
            diag = core.mask_diagnostics(self.objective, adv, c, batch.rollout_logprobs, tokens, mask, gids)
            if variant == self.cfg.mask:
                credit = c
                metrics.update({f"ibpo/{k}": v for k, v in diag.items()})
            if len(variants) > 1:
                metrics.update({f"ibpo/{variant}/{k}": diag[k] for k in ("d1_gcpr", "d2_residual")})
        assert credit is not None  # the trained mask is one of the variants
        metrics["ibpo/masked_token_frac"] = 1.0 - float(credit.sum() / mask.sum().clamp_min(1))
        return batch.with_advantages(adv, None if self.cfg.mask == "none" else credit), metrics


def _revisions(group: Group) -> GroupRevisions:
    """The group's revisions (none attempted when the reviser has not seen it)."""
    if not isinstance(group.credit, GroupRevisions):
        group.credit = GroupRevisions.empty(len(group.completions))
    return group.credit
