"""IBPO inside the trainer's step (the `ibpo` section of the job spec; docs/ibpo.md).

After a step's groups are sampled and scored, every incorrect response of a group that also holds a correct
one is shown to the policy again with a correct sibling and revised: one batched generate() through the job's
own rollout replicas (the weights, temperature and top_p that sampled the step), scored by the job's own
reward pool. A revision the verifier accepts gives its response phi = rho; the batch's advantages are those of
R' = R + lambda * phi, centred per group (rlcore.ibpo), optionally with the edit mask. Revisions are not trained
on. Time and tokens of the pass count in the step's `timing/generate_s` / `timing/reward_s` and the replicas'
token counters, and are reported on their own as `ibpo/...`.

Multi-turn (`env:`): a revision is a new trajectory in the job's environment, started from the revision prompt
and run by the job's multi-turn sampler; its edit mask is aligned over model tokens only, and failed
trajectories are filtered before centring (docs/ibpo.md, "Multi-turn").
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlcore import ibpo as core
from rlcore.config import TrajectoryCredit
from tgc_rl.batch import Completion, SampledBatch, TrainBatch
from tgc_rl.config import JobSpec
from tgc_rl.rollout.engine import Sampling
from tgc_rl.run_layout import TIMING_ENV
from tgc_rl.tasks import Score, TaskItem
from tgc_rl.tasks.params import fill_template
from tgc_rl.trainer.data import derive_seed, encode_item
from tgc_rl.trainer.groups import Group

if TYPE_CHECKING:
    from tgc_rl.trainer.multi_turn import MultiTurnSampler

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
    # the revision prompt through the chat template (single turn: what is generated from)
    prompt_ids: list[int]
    text: str  # the revision prompt's text (multi-turn: the first user message of the revision's trajectory)
    item: TaskItem
    seed: int


@dataclass
class _Revision:
    """One revision's outcome: `status` ok | timeout | error (its score's, or its trajectory's failure) |
    too_long (a trajectory whose first prompt filled its context); its tokens after the prompt and, for a
    trajectory, which of them the model sampled."""

    correct: bool
    status: str
    token_ids: list[int]
    model_mask: list[bool] | None
    turns: int

    @property
    def model_tokens(self) -> int:
        return len(self.token_ids) if self.model_mask is None else sum(self.model_mask)


def _model_edits(response: Completion, revision: _Revision) -> np.ndarray:
    """The edit mask of a repaired response, one entry per model token (what `rlcore.ibpo.naive_credit_mask`
    takes): aligned over model tokens only, observations set aside on both sides."""
    full = core.segment_edit_mask(
        response.token_ids, revision.token_ids, response.model_mask, revision.model_mask
    )
    return full if response.model_mask is None else full[np.asarray(response.model_mask, dtype=bool)]


class Reviser:
    """Generates and scores a step's revisions and turns them into the batch's advantages."""

    def __init__(self, spec: JobSpec, tokenizer: Any, objective: Any):
        if spec.ibpo is None:
            raise ValueError("the job spec has no `ibpo` section")
        self.spec, self.cfg, self.tokenizer, self.objective = spec, spec.ibpo, tokenizer, objective
        self.lam = self.cfg.lambda_ if self.cfg.lambda_ is not None else objective.config.bonus_coef
        s = spec.sampling
        self.sampling = Sampling(s.temperature, s.top_p, self.cfg.max_new_tokens or s.max_new_tokens)
        # multi-turn: phi is per trajectory, before centring, broadcast with the step's normaliser (the
        # default TrajectoryCredit): the verdict is the single-turn one, said across turns
        credit = TrajectoryCredit() if spec.env is not None else None
        self.preserves, self.reasons = core.verdict(objective.config, self.cfg.mask, credit)
        self._sampler: MultiTurnSampler | None = None  # multi-turn revisions: made on first use
        log.info(
            "IBPO: rho %.3g, lambda %.3g, %d reference(s), mask %s: %s",
            self.cfg.rho,
            self.lam,
            self.cfg.references,
            self.cfg.mask,
            "preserves cancellation" if self.preserves else "breaks cancellation: " + "; ".join(self.reasons),
        )

    # -- generation -----------------------------------------------------------------------------------
    def revision_text(self, item: TaskItem, response: str, references: list[str]) -> str:
        """The revision prompt's text: the template filled with the task prompt, the response and references."""
        return fill_template(
            self.cfg.revision_template,
            prompt=item.prompt,
            response=response,
            references=_REFERENCE_SEPARATOR.join(references),
        )

    def revision_prompt(self, item: TaskItem, response: str, references: list[str]) -> list[int]:
        """Token ids of the revision prompt: the template as the user turn, through the model's chat template
        (and system prompt) like a task prompt."""
        return self._encode(item, self.revision_text(item, response, references))

    def _encode(self, item: TaskItem, text: str) -> list[int]:
        return encode_item(self.tokenizer, self.spec.model, TaskItem(id=item.id, prompt=text))

    def after_rollout(
        self, groups: list[Group], rollout: Any, rewards: Any, metrics: dict[str, float]
    ) -> None:
        """Revise and score the incorrect responses of `groups` (each gets its GroupRevisions as `.credit`); adds
        `ibpo/...` to `metrics` and the pass's seconds to its `timing/generate_s` and `timing/reward_s` (and,
        multi-turn, `timing/env_s`)."""
        t0 = time.perf_counter()
        jobs, eligible, skipped = self._jobs(groups)
        prep_s = time.perf_counter() - t0
        if self.spec.env is None:
            outs, gen_s, reward_s, env_s = self._revise(jobs, rollout, rewards)
        else:
            outs, gen_s, reward_s, env_s = self._revise_in_env(jobs, rollout, rewards)
        repaired, edited, attempted = 0, [], []
        for j, out in zip(jobs, outs, strict=True):
            if out.status == "too_long":  # the environment's first prompt left no room for a model token
                skipped += 1
                continue
            attempted.append(out)
            rec = _revisions(groups[j.group])
            ok = out.correct
            rec.attempted[j.row], rec.revised_correct[j.row] = True, ok
            if ok:
                repaired += 1
                rec.phi[j.row] = self.cfg.rho
                if self.cfg.mask != "none":
                    edit = _model_edits(groups[j.group].completions[j.row], out)
                    rec.edits[j.row] = edit
                    edited.append(float(edit.mean()) if edit.size else 0.0)
        phis = [p for g in groups for p in _revisions(g).phi]
        tokens = [out.model_tokens for out in attempted]
        metrics["timing/generate_s"] = metrics.get("timing/generate_s", 0.0) + gen_s + prep_s
        metrics["timing/reward_s"] = metrics.get("timing/reward_s", 0.0) + reward_s
        if self.spec.env is not None:
            metrics[TIMING_ENV] = metrics.get(TIMING_ENV, 0.0) + env_s
            metrics["ibpo/env_s"] = env_s
            turns = [out.turns for out in attempted]
            metrics["ibpo/revision_turns_mean"] = sum(turns) / len(turns) if turns else 0.0
        metrics.update(
            {
                "ibpo/eligible_groups": float(eligible),
                "ibpo/revisions": float(len(attempted)),
                "ibpo/skipped_too_long": float(skipped),
                "ibpo/repaired": float(repaired),
                "ibpo/success_rate": repaired / len(attempted) if attempted else 0.0,
                "ibpo/phi_mean": sum(phis) / max(len(phis), 1),
                "ibpo/tokens": float(sum(tokens)),
                "ibpo/revision_length_mean": sum(tokens) / max(len(tokens), 1),
                "ibpo/generate_s": gen_s + prep_s,
                "ibpo/reward_s": reward_s,
                "ibpo/reward_timeouts": float(sum(out.status == "timeout" for out in attempted)),
                "ibpo/reward_errors": float(sum(out.status == "error" for out in attempted)),
                "ibpo/edited_frac_mean": sum(edited) / len(edited) if edited else 0.0,
            }
        )

    def _revise(
        self, jobs: list[_Job], rollout: Any, rewards: Any
    ) -> tuple[list[_Revision], float, float, float]:
        """Single turn: one batched generate() of the revision prompts, scored by the reward pool."""
        if not jobs:
            return [], 0.0, 0.0, 0.0
        t0 = time.perf_counter()
        outs = [
            cs[0]
            for cs in rollout.generate([j.prompt_ids for j in jobs], 1, [j.seed for j in jobs], self.sampling)
        ]
        t1 = time.perf_counter()
        texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in outs]
        scores = rewards.score([j.item for j in jobs], texts)
        t2 = time.perf_counter()
        revisions = [
            _Revision(s.correct, s.status, list(c.token_ids), None, 1)
            for c, s in zip(outs, scores, strict=True)
        ]
        return revisions, t1 - t0, t2 - t1, 0.0

    def _revise_in_env(
        self, jobs: list[_Job], rollout: Any, rewards: Any
    ) -> tuple[list[_Revision], float, float, float]:
        """Multi-turn: each revision is a new trajectory in the job's environment, its first user message the
        revision prompt (the task item's prompt replaced; its answer, and so its verifier, kept), run to its
        end by the job's own multi-turn sampler: the same bounds, environment workers, rounds of batched
        generate() calls and per-turn seeds. Its reward is its score; a failed one (bridge, deadline,
        env_error) repairs nothing."""
        if not jobs:
            return [], 0.0, 0.0, 0.0
        from tgc_rl.trainer.multi_turn import FAILED, MultiTurnSampler

        assert self.spec.env is not None  # the caller's branch
        if self._sampler is None:
            self._sampler = MultiTurnSampler(self.spec.env, self.spec.seed, self.tokenizer, rollout, rewards)
        self._sampler.rollout, self._sampler.rewards = rollout, rewards
        items = [dataclasses.replace(j.item, prompt=j.text) for j in jobs]
        run = self._sampler.run_trajectories(items, [j.seed for j in jobs], 1, self.sampling)
        out = []
        for t in run.trajectories:
            if t.model_tokens == 0 and t.end_reason == "max_total_tokens":
                status = "too_long"
            elif t.end_reason in FAILED:
                status = "timeout" if t.end_reason == "deadline" else "error"
            else:
                status = "ok"
            comp = t.completion(0)
            correct = status == "ok" and Score(t.reward).correct
            out.append(_Revision(correct, status, comp.token_ids, comp.model_mask, t.turns))
        return out, run.generate_s, 0.0, run.env_s

    def _jobs(self, groups: list[Group]) -> tuple[list[_Job], int, int]:
        jobs: list[_Job] = []
        eligible = skipped = 0
        # single turn: the engines' prompt limit; multi-turn: the trajectory's context, which its first prompt
        # must leave room in (the environment's own messages come on top: `_revise_in_env` counts the rest)
        limit = self.spec.sampling.max_prompt_tokens
        if self.spec.env is not None:
            limit = self.spec.env.bounds.max_total_tokens - 1
        for gi, g in enumerate(groups):
            g.credit = GroupRevisions.empty(len(g.completions))
            kept = g.kept  # a failed trajectory is neither revised nor a reference
            correct = [s.correct for s in g.scores]
            refs = [j for j, c in enumerate(correct) if c and kept[j]]
            wrong = [i for i, c in enumerate(correct) if not c and kept[i]]
            if not refs or not wrong:
                continue
            eligible += 1
            # a multi-turn response is the whole trajectory after its prompt: model turns and observations
            texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in g.completions]
            k = min(self.cfg.references, len(refs))
            for i in wrong:
                # rotate through the correct siblings, so the incorrect responses of a group see different ones
                chosen = [texts[refs[(i + r) % len(refs)]] for r in range(k)]
                text = self.revision_text(g.prompt.item, texts[i], chosen)
                ids = self._encode(g.prompt.item, text)
                if len(ids) > limit:
                    skipped += 1
                    continue
                seed = derive_seed(self.spec.seed, g.prompt.index, i * 104_729 + _SEED_SALT)
                jobs.append(_Job(gi, i, ids, text, g.prompt.item, seed))
        return jobs, eligible, skipped

    # -- the batch ------------------------------------------------------------------------------------
    def train_batch(self, groups: list[Group], batch: SampledBatch) -> tuple[TrainBatch, dict[str, float]]:
        """The batch with its shaped (B,) advantages and, with a mask on, the credit mask; and `ibpo/...` metrics
        of the credit: D1/D2 of the first on-policy pass for the trained mask and the other variants too."""
        recs = [_revisions(g) for g in groups]
        phi = torch.tensor([p for r in recs for p in r.phi], dtype=torch.float32)
        edits = [e for r in recs for e in r.edits]
        mask, gids, tokens = batch.response_mask, batch.group_ids, batch.response_ids
        # multi-turn: shared nodes live on the whole history (observations too), measured on model tokens; on a
        # single turn the history is the response mask itself
        present = batch.history_mask
        keep = [k for g in groups for k in g.kept]
        kept = None if all(keep) else torch.tensor(keep)  # failed trajectories: filtered before centring
        adv = core.shaped_advantages(self.objective.config, batch.rewards, gids, mask, phi, self.lam, kept)
        variants = ("none", "naive", "symmetric") if self.cfg.mask != "none" else ("none",)
        metrics: dict[str, float] = {
            "ibpo/lambda": float(self.lam),
            "ibpo/preserves_cancellation": float(self.preserves),
        }
        credit = None
        for variant in variants:
            c = core.credit_mask(variant, edits, tokens, mask, gids, present)
            diag = core.mask_diagnostics(
                self.objective, adv, c, batch.rollout_logprobs, tokens, mask, gids, present
            )
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
