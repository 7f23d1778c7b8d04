"""Shared-prompt forward: each group packed as one token tree gives the full forward's log-probs and
gradients, computes each shared token once, and makes the log-probs of tokens the copies share bit-identical."""

from types import SimpleNamespace

import pytest
import torch

import rlcore
from tests.rlcore.batches import multi_turn_batch
from tgc_rl.batch import TrainBatch
from tgc_rl.learner import Learner
from tgc_rl.learner.logprobs import PolicyLogprobs
from tgc_rl.learner.prefix_tree import pack_trees, supports_prefix_tree


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tiny_lm(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _logprobs_and_grads(policy, batch, coef):
    policy.lm.zero_grad(set_to_none=True)
    lp, ent = policy(batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask)
    ((lp * coef).sum() + 0.1 * (ent * batch.response_mask).sum()).backward()
    return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in policy.lm.named_parameters()}


def _shared_prefix_len(batch, a: int, b: int) -> int:
    ra, rb = batch.response_ids[a], batch.response_ids[b]
    n = int(min(batch.response_mask[a].sum(), batch.response_mask[b].sum()))
    diff = (ra[:n] != rb[:n]).nonzero()
    return int(diff[0]) if len(diff) else n


def test_tree_holds_each_prompt_and_each_shared_response_prefix_once():
    from tgc_rl.batch import Completion, collate

    prompts = [[5, 6, 7]] * 3 + [[8, 9]] * 2
    responses = [[10, 11, 12], [10, 11, 13, 14], [15], [10], [10, 16]]
    comps = [Completion(r, [-1.0] * len(r), "stop", 0) for r in responses]
    batch = collate(prompts, comps, [0, 0, 0, 1, 1], torch.zeros(5), pad_id=2)
    trees = pack_trees(batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask)
    assert trees is not None and trees.input_ids.shape[0] == 2  # one tree per group
    # group 0: prompt 3 + {10, 11, 12, 13, 14, 15} = 9 nodes; group 1: prompt 2 + {10, 16} = 4 nodes
    assert trees.nodes == 9 + 4 < int(batch.attention_mask.sum())
    assert trees.input_ids[0].tolist() == [5, 6, 7, 10, 11, 12, 13, 14, 15]  # depth-first
    assert trees.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 5, 6, 3]
    assert trees.targets.tolist() == [t for r in responses for t in r]
    mask = trees.attention_mask(eager=False)[0, 0]
    assert mask[7].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 6, 7]  # 14 sees its own ancestors only
    assert mask[8].nonzero().flatten().tolist() == [0, 1, 2, 8]


def test_no_tree_where_no_two_adjacent_rows_share_a_prompt(make_batch):
    batch = make_batch(n_groups=2, group_size=2)
    rows = torch.tensor([0, 2])  # one row of each group
    sub = batch.select(rows)
    assert pack_trees(sub.input_ids, sub.attention_mask, sub.prompt_len, sub.response_mask) is None


def test_models_without_plain_causal_attention_use_the_full_forward():
    def lm(model_type, attn="sdpa", **extra):
        return SimpleNamespace(
            config=SimpleNamespace(model_type=model_type, _attn_implementation=attn, **extra)
        )

    assert supports_prefix_tree(lm("llama"))
    assert supports_prefix_tree(lm("qwen2", sliding_window=4096, use_sliding_window=False))
    assert not supports_prefix_tree(lm("mistral", sliding_window=4096))
    assert not supports_prefix_tree(lm("gemma2"))
    assert not supports_prefix_tree(lm("llama", attn="flex_attention"))


def multi_turn(seed: int, objective: str = "cp_grpo", n_groups: int = 3) -> TrainBatch:
    """Multi-turn trajectories (tests/rlcore/batches.py): loss masks with holes where tool output sits."""
    b = multi_turn_batch(seed, n_groups=n_groups).batch
    b.rollout_logprobs, b.rewards = b.rollout_logprobs.float(), b.rewards.float()
    return b.with_advantages(
        rlcore.get_objective(objective).advantages(b.rewards, b.group_ids, b.response_mask)
    )


@pytest.mark.parametrize("turns", ["single", "multi"])
def test_tree_forward_gives_the_full_forward_logprobs_and_gradients(tiny_model_path, make_batch, turns):
    """Left-padded prompts of different lengths, ragged responses with a shared 3-token prefix, chunked head;
    multi: trajectories whose shared prefix runs through a tool call and its output (a mask with holes)."""
    batch = make_batch(n_groups=3, seed=1, max_prompt=12) if turns == "single" else multi_turn(1)
    coef = (
        torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(0))
        * batch.response_mask
    )
    lm = _tiny_lm(tiny_model_path)
    full = _logprobs_and_grads(PolicyLogprobs(lm, chunk_tokens=5), batch, coef)
    tree_policy = PolicyLogprobs(lm, chunk_tokens=5, prefix_tree=True)
    tree = _logprobs_and_grads(tree_policy, batch, coef)
    assert tree_policy.last_nodes < int(batch.attention_mask.sum())  # the tree path ran
    assert bool((tree[0][batch.response_mask == 0] == 0).all())  # observations and padding: no log-prob
    torch.testing.assert_close(tree[0], full[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tree[1], full[1], rtol=1e-5, atol=1e-5)
    for name, want in full[2].items():  # float32 rounding, relative to each gradient's scale
        torch.testing.assert_close(tree[2][name], want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


def test_tokens_the_copies_share_get_bit_identical_logprobs(tiny_model_path, make_batch):
    batch = make_batch(n_groups=3, seed=2, common_prefix=3)
    with torch.no_grad():
        lp, ent = PolicyLogprobs(_tiny_lm(tiny_model_path), chunk_tokens=7, prefix_tree=True)(
            batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask
        )
    pairs = 0
    for g in batch.group_ids.unique():
        rows = (batch.group_ids == g).nonzero().flatten().tolist()
        for b in rows[1:]:
            k = _shared_prefix_len(batch, rows[0], b)
            assert k >= 3
            assert torch.equal(lp[b, :k], lp[rows[0], :k]) and torch.equal(ent[b, :k], ent[rows[0], :k])
            assert torch.equal(ent[b, 0], ent[rows[0], 0])  # one prompt, one distribution for the first token
            pairs += 1
    assert pairs == 9


@pytest.mark.parametrize("turns", ["single", "multi"])
def test_learner_gradient_with_shared_prompts_equals_the_full_forward(
    learner_spec, tiny_model_path, make_batch, turns
):
    """Several micro-batches (2 groups each) with step-wide normalisers, against one full forward per row;
    multi: ragged multi-turn trajectories (loss masks with holes)."""
    batch = make_batch(n_groups=5, objective="grpo") if turns == "single" else multi_turn(2, "grpo", 5)
    spec = {"objective.name": "grpo", "optim.micro_batch_size": 8}
    full = Learner(learner_spec(**spec, **{"optim.shared_prompt_forward": False}), tiny_model_path)
    shared = Learner(learner_spec(**spec), tiny_model_path)
    assert shared.policy.prefix_tree and not full.policy.prefix_tree
    g_full, g_shared = full.gradients(batch), shared.gradients(batch)
    assert g_full.keys() == g_shared.keys()
    for name in g_full:
        torch.testing.assert_close(g_shared[name], g_full[name], rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(shared.logprobs(batch), full.logprobs(batch), rtol=1e-5, atol=1e-5)
