"""sampling.overlong in the trainer: truncated responses shaped (DAPO's soft penalty) or filtered before
centring in Trainer.build_batch keep D2 at rounding on a trainer-built batch; the spec's defaults and refusals;
the schema shows the knob."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

import rlcore
from rlcore.diagnostics import ascent_weights
from rlcore.shared_nodes import shared_node_residual
from tgc_rl.batch import Completion, TrainBatch
from tgc_rl.cli import main
from tgc_rl.config import JobSpec, SamplingSpec
from tgc_rl.run_layout import OVERLONG_DROPPED_GROUPS, OVERLONG_FRAC
from tgc_rl.tasks import Score, TaskItem
from tgc_rl.trainer.credit import ObjectiveCredit
from tgc_rl.trainer.data import Prompt
from tgc_rl.trainer.loop import Group, Trainer

MAX = 7  # sampling.max_new_tokens of these batches: a response of 7 tokens hit it ("length")
G = 6


def groups(seed: int, n_groups: int = 4) -> tuple[list[Group], dict[tuple[int, ...], float]]:
    """Responses over a two-token vocabulary (shared prefixes of every depth), log-probs a function of the
    node as a model gives them; rows 0 and 1 of each group reward 1 and 0, and are never truncated."""
    gen = torch.Generator().manual_seed(seed)
    new: dict[tuple[int, ...], float] = {}  # the learner's log-prob of each node
    out = []
    for g in range(n_groups):
        comps, scores = [], []
        for i in range(G):
            n = MAX if i >= 2 and i % 2 == 0 else int(torch.randint(2, MAX, (1,), generator=gen))
            tokens = (torch.randint(0, 2, (n,), generator=gen) + 3).tolist()
            old = []
            for t in range(n):
                key = (g, *tokens[: t + 1])
                if key not in new:
                    new[key] = -float(torch.rand((), generator=gen)) * 2 - 0.05
                # the sampler's value: off the learner's, equal on copies of a node
                old.append(new[key] - 0.1 * (t % 3))
            comps.append(Completion(tokens, old, "length" if n == MAX else "stop", 0))
            scores.append(Score(float(i == 0 or (i > 1 and torch.rand((), generator=gen) < 0.5))))
        out.append(Group(Prompt(g, TaskItem(id=str(g), prompt="q"), [9, 8, g + 10]), comps, scores))
    return out, new


def trainer(**overlong: object) -> SimpleNamespace:
    sampling = SamplingSpec(max_new_tokens=MAX, overlong=overlong or {})  # type: ignore[arg-type]
    return SimpleNamespace(
        credit=ObjectiveCredit(rlcore.get_objective("cp_grpo"), sampling),
        tokenizer=SimpleNamespace(pad_token_id=0),
    )


def build(seed: int, **overlong: object) -> tuple[TrainBatch, dict[str, float], dict[tuple[int, ...], float]]:
    gs, new = groups(seed)
    batch, m = Trainer.build_batch(trainer(**overlong), gs)  # type: ignore[arg-type]
    return batch, m, new


def d2(
    batch: TrainBatch, new: dict[tuple[int, ...], float], loss_adv: torch.Tensor | None = None
) -> dict[str, float]:
    """D2 of the step; loss_adv: what the loss weights by, when not the batch's advantages (the diagnostics
    read those, as the learner does)."""
    mask = batch.response_mask
    logprobs = torch.zeros(mask.shape, dtype=torch.float64)
    for i, (g, ids) in enumerate(zip(batch.group_ids.tolist(), batch.response_ids.tolist(), strict=True)):
        for t in range(int(mask[i].sum())):
            logprobs[i, t] = new[(g, *ids[: t + 1])]
    obj = rlcore.get_objective("cp_grpo")
    old = batch.rollout_logprobs.double()
    adv = batch.advantages if loss_adv is None else loss_adv
    w, _ = ascent_weights(obj, logprobs, old, adv.double(), mask, batch.group_ids)
    return shared_node_residual(w, batch.response_ids, mask, batch.advantages, batch.group_ids)


def truncated(batch: TrainBatch) -> torch.Tensor:
    return batch.response_mask.sum(1) == MAX


@pytest.mark.parametrize("seed", range(2))
def test_shaping_in_build_batch_penalises_before_centring_and_keeps_d2_at_rounding(seed):
    batch, m, new = build(seed, mode="shape", buffer=3, factor=0.5)
    plain, plain_m, _ = build(seed)
    assert plain_m == {} and not torch.allclose(batch.advantages, plain.advantages)  # the penalty acts
    lengths = batch.response_mask.sum(1)
    assert m[OVERLONG_FRAC] == pytest.approx(float((lengths > MAX - 3).float().mean()))
    assert torch.allclose(batch.advantages.view(4, G).sum(1), torch.zeros(4), atol=1e-6)
    out = d2(batch, new)
    assert out["diag/d2_nodes"] > 10 and float(out["diag/d2_residual"]) <= 1e-6


@pytest.mark.parametrize("seed", range(2))
def test_filtering_in_build_batch_zeroes_truncated_responses_and_keeps_d2_at_rounding(seed):
    batch, m, new = build(seed, mode="filter")
    cut = truncated(batch)
    assert cut.any() and (batch.advantages[cut] == 0).all()
    assert m[OVERLONG_FRAC] == pytest.approx(float(cut.float().mean())) and m[OVERLONG_DROPPED_GROUPS] == 0
    assert torch.allclose(batch.advantages.view(4, G).sum(1), torch.zeros(4), atol=1e-6)
    out = d2(batch, new)
    assert out["diag/d2_nodes"] > 10 and float(out["diag/d2_residual"]) <= 1e-6
    # what filtering replaces: zeroing the truncated after centring leaves D2 well above rounding
    plain, _, _ = build(seed)
    dropped = plain.advantages.masked_fill(cut, 0.0)
    assert float(d2(plain, new, loss_adv=dropped)["diag/d2_residual"]) > 1e-3


def test_a_group_left_with_fewer_than_two_is_zeroed_and_counted():
    gs, _ = groups(0, n_groups=2)
    for c in gs[1].completions[1:]:
        c.finish_reason = "length"
    batch, m = Trainer.build_batch(trainer(mode="filter"), gs)  # type: ignore[arg-type]
    assert m[OVERLONG_DROPPED_GROUPS] == 1 and (batch.advantages[G:] == 0).all()
    assert batch.advantages[:G].abs().sum() > 0


def test_spec_default_is_off_and_bad_combinations_name_the_field():
    assert JobSpec().sampling.overlong.mode == "none"
    with pytest.raises(ValidationError, match="sampling.overlong.buffer: required with mode 'shape'"):
        SamplingSpec(overlong={"mode": "shape"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="sampling.overlong.buffer: required with mode 'shape'"):
        SamplingSpec(overlong={"mode": "filter", "buffer": 4})  # type: ignore[arg-type]
    with pytest.raises(
        ValidationError, match=r"sampling.overlong.buffer \(65\) exceeds sampling.max_new_tokens"
    ):
        SamplingSpec(max_new_tokens=64, overlong={"mode": "shape", "buffer": 65})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="factor"):
        SamplingSpec(overlong={"mode": "shape", "buffer": 4, "factor": 0})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="sampling.overlong.mode: not supported with `ibpo`"):
        JobSpec.model_validate(
            {"objective": {"name": "ibpo_cp"}, "sampling": {"overlong": {"mode": "filter"}}}
        )


def test_the_schema_shows_the_knob(capsys):
    assert main(["schema"]) == 0
    defs = json.loads(capsys.readouterr().out)["$defs"]
    assert defs["OverlongSpec"]["properties"]["mode"]["enum"] == ["none", "shape", "filter"]
    assert "overlong" in defs["SamplingSpec"]["properties"]
