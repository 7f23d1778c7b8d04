"""Objective.loss refuses bad inputs with a message that names the argument and the fix."""

from __future__ import annotations

import pytest
import torch

import rlcore
from tests.rlcore.batches import make_batch

B = make_batch(0, 2, 3, 5)
OBJ = rlcore.get_objective("grpo")
ADV = OBJ.advantages(B.rewards, B.group_ids, B.mask)
NAN = B.logprobs.clone().index_put_(
    (torch.tensor([1]), torch.tensor([4])), torch.tensor(float("nan"), dtype=torch.float64)
)


def call(obj=OBJ, **kw):
    args = dict(
        logprobs=B.logprobs, old_logprobs=B.old_logprobs, advantages=ADV, mask=B.mask, group_ids=B.group_ids
    )
    args |= kw
    return obj.loss(**args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(logprobs=B.logprobs[0]), "logprobs: expected a 2-D"),
        (dict(logprobs=B.logprobs.tolist()), "logprobs: expected a torch.Tensor"),
        (dict(logprobs=torch.zeros(0, 5)), "logprobs: empty batch"),
        (dict(logprobs=B.logprobs.long()), "logprobs: expected a floating-point"),
        (dict(old_logprobs=B.old_logprobs[:, :4]), r"old_logprobs: expected shape \(6, 5\)"),
        (dict(advantages=ADV[:5]), "advantages: expected shape"),
        (dict(advantages=ADV.long()), "advantages: expected a floating-point"),
        (dict(mask=B.mask[:, :3]), "mask: expected shape"),
        (dict(mask=B.mask.double() * 2), "mask: values must be 0/1"),
        (dict(mask=torch.zeros_like(B.mask)), "mask: selects no tokens"),
        (dict(group_ids=B.group_ids.double()), "group_ids: expected an integer"),
        (dict(group_ids=B.group_ids[:4]), "group_ids: expected shape"),
        (dict(logprobs=NAN), r"logprobs: contains 1 NaN/inf value\(s\), first at index \(1, 4\)"),
        (dict(old_logprobs=NAN), "old_logprobs: contains 1 NaN"),
        (dict(advantages=torch.full_like(ADV, float("inf"))), "advantages: contains 6 NaN"),
    ],
)
def test_bad_loss_inputs_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        call(**kwargs)


def test_kl_objective_requires_reference_logprobs():
    with pytest.raises(ValueError, match="ref_logprobs: required.*kl_coef=0.04"):
        call(obj=rlcore.get_objective("grpo", kl_coef=0.04))


def test_reference_logprobs_are_checked_for_nan():
    with pytest.raises(ValueError, match="ref_logprobs: contains"):
        call(obj=rlcore.get_objective("grpo", kl_coef=0.04), ref_logprobs=NAN)


def test_entropy_bonus_requires_entropies():
    with pytest.raises(ValueError, match="entropies: required.*entropy_coef"):
        call(obj=rlcore.get_objective("grpo", entropy_coef=0.01))


def test_sequence_weights_are_refused_without_a_group_transform():
    with pytest.raises(ValueError, match="seq_weights"):
        call(seq_weights=torch.ones(6, dtype=torch.float64))


def test_step_must_be_a_step_norm():
    with pytest.raises(ValueError, match="StepNorm"):
        call(step={"tokens": 10})


def test_bfloat16_logprobs_are_upcast_and_keep_their_gradient_dtype():
    lp = B.logprobs.to(torch.bfloat16).requires_grad_(True)
    out = call(logprobs=lp, old_logprobs=B.old_logprobs.to(torch.bfloat16), advantages=ADV.float())
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and lp.grad.dtype == torch.bfloat16


def test_loss_without_regularisers_is_the_policy_gradient_term():
    out = call()
    assert out.loss is out.pg_loss
    assert set(out.metrics) >= {
        "loss/pg",
        "loss/total",
        "ratio/mean",
        "clip/frac",
        "clip/frac_pos",
        "clip/frac_neg",
        "tokens",
    }
    assert all(isinstance(v, float) for v in out.metrics.values())
