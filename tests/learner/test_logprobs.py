"""Chunked log-probs: same values and gradients as whole logits, without ever holding whole logits."""

import pytest
import torch
import torch.nn.functional as F

from tgc_rl.learner.logprobs import PolicyLogprobs, chunked_head_logprobs, position_ids


def _full(hidden, weight, targets, temperature=1.0, bias=None):
    logits = (hidden @ weight.T + (0 if bias is None else bias)) / temperature
    logp = F.log_softmax(logits, -1)
    ent = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, targets[:, None]).squeeze(-1), ent


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_head_matches_full_logits_values_and_gradients(chunk):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(64, 32, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(500, 32, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(500, generator=gen, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 500, (64,), generator=gen)
    coef = torch.randn(64, generator=gen, dtype=torch.float64)

    lp, ent = chunked_head_logprobs(h, w, b, t, chunk, inv_temperature=1 / 0.7)
    ((lp * coef).sum() + ent.sum()).backward()
    grads = h.grad.clone(), w.grad.clone(), b.grad.clone()
    h.grad = w.grad = b.grad = None
    lp_ref, ent_ref = _full(h, w, t, temperature=0.7, bias=b)
    ((lp_ref * coef).sum() + ent_ref.sum()).backward()

    torch.testing.assert_close(lp, lp_ref, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(grads[0], h.grad, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(grads[1], w.grad, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(grads[2], b.grad, rtol=1e-9, atol=1e-10)


def test_gradient_of_the_logprobs_alone_matches_full_logits():
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(40, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(300, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 300, (40,), generator=gen)
    lp, _ = chunked_head_logprobs(h, w, None, t, 9)
    lp.sum().backward()  # the entropy output is unused: its gradient arrives as None
    grads = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    _full(h, w, t)[0].sum().backward()
    torch.testing.assert_close(grads[0], h.grad, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(grads[1], w.grad, rtol=1e-9, atol=1e-10)


def test_backward_keeps_no_whole_logits_alive():
    """Autograd saves only the head's inputs: everything saved for backward is far smaller than the
    (tokens x vocab) logits (plain autograd over chunks would keep every chunk's logits)."""
    n, vocab, chunk = 256, 4096, 32
    h = torch.randn(n, 16, requires_grad=True)
    w = torch.randn(vocab, 16, requires_grad=True)
    t = torch.randint(0, vocab, (n,))
    saved = {}

    def pack(x):
        saved[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes() // x.element_size()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        lp, _ = chunked_head_logprobs(h, w, None, t, chunk)
    lp.sum().backward()
    total = sum(saved.values())
    assert total < n * vocab // 4, f"autograd saved {total} values (whole logits: {n * vocab})"
    assert torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()


def test_position_ids_count_real_tokens_only():
    attn = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    pos = position_ids(attn)
    assert pos[0, 2:5].tolist() == [0, 1, 2]
    assert pos[1].tolist() == [0, 1, 2, 3, 4, 5]


def test_left_padded_batch_matches_unpadded_forward_of_each_row(tiny_model_path, make_batch):
    """Padding, position ids and response alignment: every row as if it were alone, with whole logits."""
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    policy = PolicyLogprobs(lm, chunk_tokens=5).eval()
    batch = make_batch(n_groups=3, seed=1)
    with torch.no_grad():
        lp, ent = policy(batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask)
        for i in range(len(batch)):
            ids = batch.input_ids[i][batch.attention_mask[i].bool()]
            n = int(batch.response_mask[i].sum())
            logits = lm(input_ids=ids[None]).logits[0].float()
            logp = F.log_softmax(logits[-n - 1 : -1], -1)
            want = logp.gather(-1, ids[-n:, None]).squeeze(-1)
            torch.testing.assert_close(lp[i, :n], want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(ent[i, :n], -(logp.exp() * logp).sum(-1), rtol=1e-4, atol=1e-4)
            assert lp[i, n:].abs().sum() == 0  # nothing off the response mask
