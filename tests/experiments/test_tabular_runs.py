"""experiments.tabular: the toy's training loop, with mini-batches, traces and entropies."""

import pytest
import torch

import rlcore
from experiments.tabular import (
    TabularPolicy,
    TabularRun,
    ToyConfig,
    logprobs,
    run,
    sample,
    snapshot,
    token_entropies,
)

SHORT = ToyConfig(steps=12, prompts_per_step=8, group_size=4, epochs=2)


def _plain_loop(name: str, cfg: ToyConfig) -> dict[str, float]:
    """The textbook loop the harness must reproduce: `loss.backward()` on the whole batch, per stage and epoch."""
    objective = rlcore.get_objective(name)
    gen = torch.Generator().manual_seed(cfg.seed)
    policy = TabularPolicy(cfg)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    success = []
    for _ in range(cfg.steps):
        batch = sample(policy, cfg, gen)
        with torch.no_grad():
            old = logprobs(policy, batch)
        adv = objective.advantages(batch.rewards, batch.group_ids, batch.mask)
        for stage in objective.stages(old, batch.mask):
            for _ in range(cfg.epochs):
                out = objective.loss(
                    logprobs(policy, batch), old, adv, batch.mask, batch.group_ids, stage_mask=stage
                )
                opt.zero_grad(set_to_none=True)
                out.loss.backward()
                opt.step()
        success.append(snapshot(policy, cfg)["success"])
    hit = [i for i, s in enumerate(success) if s >= 0.75]
    return {**snapshot(policy, cfg), "t75": float(hit[0] if hit else cfg.steps)}


@pytest.mark.parametrize("objective", ["grpo", "dfpo_min", "grpo_lopti"])
def test_one_minibatch_reproduces_the_plain_loss_backward_loop_exactly(objective):
    ref = _plain_loop(objective, SHORT)
    ours = run(TabularRun(objective, toy=SHORT))["final"]
    assert ours["success"] == ref["success"]
    assert ours["p_verbose"] == ref["p_verbose"]
    assert ours["template_drift"] == ref["template_drift"]
    assert ours["t75"] == ref["t75"]


def test_traces_start_at_the_initial_policy_and_end_at_the_final_values():
    out = run(TabularRun("cp_grpo", toy=SHORT, trace_every=4))
    assert out["trace_steps"] == [0, 4, 8, 12]
    assert out["curves"]["p_verbose"][0] == 0.5
    assert out["curves"]["p_verbose"][-1] == out["final"]["p_verbose"]
    assert len(out["curves"]["diag/d1_gcpr"]) == len(out["trace_steps"]) - 1


def test_split_groups_run_dfpo_with_whole_group_weights():
    out = run(TabularRun("dfpo_min", toy=SHORT, mini_batches=2, split_groups=True))
    assert out["final"]["diag/d4_groups_complete_frac"] == 0.0
    assert out["final"]["cancel_resid"] > 0.05


def test_token_entropies_are_the_slot_entropies():
    cfg = ToyConfig(prompts_per_step=4, group_size=2)
    policy = TabularPolicy(cfg)
    batch = sample(policy, cfg, torch.Generator().manual_seed(0))
    ent = token_entropies(policy, batch)
    template = -(torch.softmax(policy.template, 0) * torch.log_softmax(policy.template, 0)).sum()
    assert torch.allclose(ent[:, 0], template.expand(ent.shape[0]))
    assert torch.allclose(ent[:, 1], torch.full_like(ent[:, 1], torch.log(torch.tensor(2.0)).item()))
    assert bool((ent[~batch.mask] == 0).all())


def test_run_rejects_a_split_that_cannot_divide_the_group():
    with pytest.raises(ValueError, match="split_groups needs mini_batches"):
        TabularRun("grpo", toy=ToyConfig(group_size=6), mini_batches=4, split_groups=True)
