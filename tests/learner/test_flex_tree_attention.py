"""Tree attention without an L x L mask (tgc_rl/learner/tree_attention.py): the block kernel gives the dense
mask's attention, the shared-prompt forward on it gives the full forward's log-probs and gradients, and the
learner picks it by length (optim.dense_tree_max_tokens)."""

import logging

import pytest
import torch
import torch.nn.functional as F

from tests.learner.test_prefix_tree import _logprobs_and_grads, _one_thread, _tiny_lm, multi_turn  # noqa: F401
from tgc_rl.learner import Learner
from tgc_rl.learner import tree_attention as tree_module
from tgc_rl.learner.logprobs import DENSE_TREE_MAX_TOKENS_CUDA, PolicyLogprobs
from tgc_rl.learner.prefix_tree import pack_trees
from tgc_rl.learner.tree_attention import flex_tree_attention, tree_attention, tree_ends_mask


def _trees(make_batch, seed=1):
    batch = make_batch(n_groups=3, seed=seed, max_prompt=12, common_prefix=2)
    trees = pack_trees(batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask)
    assert trees is not None and trees.input_ids.shape[0] == 3
    return trees


@pytest.mark.parametrize("block", [1, 5, 4096])
def test_block_kernel_equals_sdpa_with_the_dense_tree_mask(make_batch, block):
    """Three ragged trees (padding nodes included), grouped-query heads (4 query heads on 2 key heads), blocks
    that cut subtrees anywhere: outputs and all three input gradients equal SDPA's on the dense mask."""
    trees = _trees(make_batch)
    k_, L = trees.input_ids.shape
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(k_, 4, L, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(k_, 2, L, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(k_, 2, L, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    g_out = torch.randn(k_, 4, L, 8, generator=gen, dtype=torch.float64)

    out = tree_attention(q, k, v, trees.subtree_end, scale=0.3, block=block)
    grads = torch.autograd.grad((out * g_out).sum(), (q, k, v))
    ref = F.scaled_dot_product_attention(
        q, k, v, attn_mask=trees.attention_mask(eager=False), scale=0.3, enable_gqa=True
    )
    ref_grads = torch.autograd.grad((ref * g_out).sum(), (q, k, v))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_flex_path_masks_as_the_block_kernel_and_builds_one_block_mask_per_tree(make_batch, monkeypatch):
    """The CUDA path (compiled FlexAttention; its backward needs CUDA) checked here for its mask: eager
    FlexAttention's forward on ragged trees (lengths not a multiple of its 128-block, grouped-query heads)
    equals the block kernel's; the block mask is built once per tree mask and reused by every layer."""
    from torch.nn.attention import flex_attention as flex_module

    monkeypatch.setattr(tree_module, "_flex", flex_module.flex_attention)  # eager: no CPU compile
    monkeypatch.setattr(tree_module, "_flex_mask", None)
    built = []
    real_create = flex_module.create_block_mask
    monkeypatch.setattr(
        flex_module, "create_block_mask", lambda *a, **k: built.append(1) or real_create(*a, **k)
    )
    trees = _trees(make_batch, seed=3)
    k_, L = trees.input_ids.shape
    assert L % tree_module.FLEX_BLOCK
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(k_, 4, L, 8, generator=gen)
    k, v = (torch.randn(k_, 2, L, 8, generator=gen) for _ in range(2))
    mask = tree_ends_mask(trees.subtree_end)
    want = tree_attention(q, k, v, trees.subtree_end, scale=0.3)
    for _layer in range(2):
        torch.testing.assert_close(flex_tree_attention(q, k, v, mask, 0.3), want, rtol=1e-5, atol=1e-5)
    assert len(built) == 1
    flex_tree_attention(q, k, v, tree_ends_mask(trees.subtree_end), 0.3)  # the next tree: a new mask
    assert len(built) == 2


def test_block_kernel_gathers_only_ancestor_keys(make_batch):
    """The sparsity is exact: with one query per block, a NaN in one leaf's key and value reaches that leaf's
    output only (the kernel never touches another node's keys; a dense product with a mask would: 0 * NaN)."""
    trees = _trees(make_batch, seed=2)
    L = trees.input_ids.shape[1]
    end = trees.subtree_end[:1]
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, L, 4, generator=gen) for _ in range(3))
    base = tree_attention(q, k, v, end, scale=0.5, block=1)
    leaf = int((end[0] == torch.arange(1, L + 1)).nonzero()[0])  # the first leaf: nothing below it
    k[:, :, leaf] = v[:, :, leaf] = float("nan")
    out = tree_attention(q, k, v, end, scale=0.5, block=1)
    others = torch.arange(L) != leaf
    assert bool(out[:, :, leaf].isnan().all())
    torch.testing.assert_close(out[:, :, others], base[:, :, others], rtol=0, atol=0)


@pytest.mark.parametrize("turns", ["single", "multi"])
def test_block_tree_forward_gives_the_full_forward_logprobs_and_gradients(tiny_model_path, make_batch, turns):
    batch = make_batch(n_groups=3, seed=1, max_prompt=12) if turns == "single" else multi_turn(1)
    coef = (
        torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(0))
        * batch.response_mask
    )
    lm = _tiny_lm(tiny_model_path)
    full = _logprobs_and_grads(PolicyLogprobs(lm, chunk_tokens=5), batch, coef)
    policy = PolicyLogprobs(lm, chunk_tokens=5, prefix_tree=True, dense_tree_max_tokens=0)
    tree = _logprobs_and_grads(policy, batch, coef)
    assert policy.last_tree_attention == "block" and policy.last_nodes < int(batch.attention_mask.sum())
    torch.testing.assert_close(tree[0], full[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tree[1], full[1], rtol=1e-5, atol=1e-5)
    for name, want in full[2].items():
        torch.testing.assert_close(tree[2][name], want, rtol=1e-4, atol=1e-5 * float(want.abs().max()))


def test_full_forward_is_unchanged_on_the_dispatcher(tiny_model_path, make_batch):
    """A policy with shared prompts switches the model to the `tgc_tree` dispatcher; rows that are not a tree
    (the full forward, the reference model) still go to SDPA: bit-identical log-probs."""
    batch = make_batch(n_groups=2, seed=4)
    lm = _tiny_lm(tiny_model_path)
    args = batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask
    with torch.no_grad():
        before = PolicyLogprobs(lm, chunk_tokens=8)(*args)
        assert PolicyLogprobs(lm, chunk_tokens=8, prefix_tree=True).tree_kernel
        assert lm.config._attn_implementation == "tgc_tree"
        after = PolicyLogprobs(lm, chunk_tokens=8)(*args)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


@pytest.mark.parametrize("ckpt", [False, True])
def test_learner_block_tree_gradient_equals_the_full_forward(learner_spec, tiny_model_path, make_batch, ckpt):
    """Several micro-batches (2 groups each) on the block kernel, with and without activation checkpointing
    (a recomputed layer must take the kernel again), against one full forward per row."""
    batch = make_batch(n_groups=5, objective="grpo")
    spec = {"objective.name": "grpo", "optim.micro_batch_size": 8}
    full = Learner(learner_spec(**spec, **{"optim.shared_prompt_forward": False}), tiny_model_path)
    block = Learner(
        learner_spec(**spec, **{"optim.dense_tree_max_tokens": 0, "optim.activation_checkpointing": ckpt}),
        tiny_model_path,
    )
    g_full, g_block = full.gradients(batch), block.gradients(batch)
    assert block.policy.last_tree_attention == "block"
    assert g_full.keys() == g_block.keys()
    for name in g_full:
        torch.testing.assert_close(g_block[name], g_full[name], rtol=1e-4, atol=1e-7)


def test_attention_is_chosen_by_tree_length_and_logged_once(tiny_model_path, make_batch, caplog):
    batch = make_batch(n_groups=2, seed=5)
    args = batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask
    L = pack_trees(*args).input_ids.shape[1]
    policy = PolicyLogprobs(
        _tiny_lm(tiny_model_path), chunk_tokens=8, prefix_tree=True, dense_tree_max_tokens=L
    )
    with caplog.at_level(logging.INFO, logger="tgc_rl.learner.logprobs"), torch.no_grad():
        policy(*args)
        assert policy.last_tree_attention == "dense"  # at the threshold: dense
        policy.dense_tree_max_tokens = L - 1
        policy(*args)
        policy(*args)
        assert policy.last_tree_attention == "block"
    chosen = [r.getMessage() for r in caplog.records if "tree attention" in r.getMessage()]
    assert len(chosen) == 2 and "dense" in chosen[0] and "block" in chosen[1]


def test_the_default_threshold_is_the_devices(tiny_model_path, make_batch, monkeypatch):
    """optim.dense_tree_max_tokens null: each forward takes its device's measured threshold (the CPU's here)."""
    from tgc_rl.learner import logprobs

    batch = make_batch(n_groups=2, seed=5)
    args = batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask
    L = pack_trees(*args).input_ids.shape[1]
    policy = PolicyLogprobs(_tiny_lm(tiny_model_path), chunk_tokens=8, prefix_tree=True)
    assert policy.dense_tree_max_tokens is None
    assert (
        DENSE_TREE_MAX_TOKENS_CUDA == 0
    )  # CUDA: FlexAttention for every tree, the dense mask never measured faster
    with torch.no_grad():
        monkeypatch.setattr(logprobs, "DENSE_TREE_MAX_TOKENS", L)
        policy(*args)
        assert policy.last_tree_attention == "dense"
        monkeypatch.setattr(logprobs, "DENSE_TREE_MAX_TOKENS", L - 1)
        policy(*args)
        assert policy.last_tree_attention == "block"


def test_eager_models_keep_the_dense_mask(tiny_model_path, make_batch):
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(
        tiny_model_path, dtype=torch.float32, attn_implementation="eager"
    )
    policy = PolicyLogprobs(lm, chunk_tokens=8, prefix_tree=True, dense_tree_max_tokens=0)
    batch = make_batch(n_groups=2, seed=6)
    with torch.no_grad():
        policy(batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask)
    assert not policy.tree_kernel and policy.last_tree_attention == "dense"
    assert lm.config._attn_implementation == "eager"


def test_threshold_knob_default_and_bounds():
    from pydantic import ValidationError

    from tgc_rl.config import OptimSpec

    assert OptimSpec().dense_tree_max_tokens is None  # by device: the policy resolves it per forward
    with pytest.raises(ValidationError, match="dense_tree_max_tokens"):
        OptimSpec(dense_tree_max_tokens=-1)
