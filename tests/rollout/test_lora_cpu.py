"""tgc_rl/rollout/lora_cpu.py: the per-adapter matmuls give what vLLM's CPU LoRA ops give, on the shapes vLLM's
punica wrapper passes them (decode, and prefill through the sgmv ops), and leave other shapes to vLLM."""

import pytest
import torch

from tgc_rl.rollout import lora_cpu

lora_ops = pytest.importorskip("vllm.lora.ops.torch_ops.lora_ops")
punica_cpu = pytest.importorskip("vllm.lora.punica_wrapper.punica_cpu")

TOKENS, IN, RANK, OUT, SLOTS = 7, 24, 4, 18, 3
# one adapter for every token (a tgc-rl engine), several (a shared engine's tenants), and -1, which vLLM's op
# reads as the last slot
INDICES = [[0] * TOKENS, [2, 0, 1, 2, 0, 0, 1], [1, -1, 0, -1, 2, 1, 1]]


@pytest.fixture(scope="module", autouse=True)
def installed():
    lora_cpu.install()
    lora_cpu.install()  # idempotent: the originals stay vLLM's own


def _tensors(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, IN, generator=g)
    a = torch.randn(SLOTS, 1, RANK, IN, generator=g)  # the stacked lora_a of one layer slice
    b = torch.randn(SLOTS, 1, OUT, RANK, generator=g)
    h = torch.randn(TOKENS, RANK, generator=g)
    y = torch.randn(TOKENS, OUT + 6, generator=g)  # a fused output with room for other slices
    return x, a, b, h, y


def test_install_routes_vllms_modules_through_the_per_adapter_ops_and_keeps_the_originals():
    for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice"):
        assert getattr(lora_ops, name) is getattr(lora_cpu, name) is getattr(punica_cpu, name)
        assert lora_cpu._ORIGINAL[name].__module__ == lora_ops.__name__


@pytest.mark.parametrize("indices", INDICES)
@pytest.mark.parametrize("add_inputs", [False, True])
def test_each_op_equals_vllms_own(indices, add_inputs):
    x, a, b, h, y = _tensors(len(indices) + sum(indices))
    idx = torch.tensor(indices)
    original = lora_cpu._ORIGINAL

    mine, theirs = torch.zeros(TOKENS, RANK), torch.zeros(TOKENS, RANK)
    lora_cpu.bgmv_shrink(x, a, mine, idx, 0.5)
    original["bgmv_shrink"](x, a, theirs, idx, 0.5)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)

    mine, theirs = y[:, :OUT].clone(), y[:, :OUT].clone()
    lora_cpu.bgmv_expand(h, b, mine, idx, add_inputs)
    original["bgmv_expand"](h, b, theirs, idx, add_inputs)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)

    mine, theirs = y.clone(), y.clone()
    lora_cpu.bgmv_expand_slice(h, b, mine, idx, 3, OUT, add_inputs)
    original["bgmv_expand_slice"](h, b, theirs, idx, 3, OUT, add_inputs)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    assert torch.equal(mine[:, :3], y[:, :3]) and torch.equal(mine[:, 3 + OUT :], y[:, 3 + OUT :])


def test_the_prefill_ops_reach_the_per_adapter_ops_with_each_sequences_adapter(monkeypatch):
    x, a, _, _, _ = _tensors(0)
    calls = []
    monkeypatch.setattr(lora_ops, "bgmv_shrink", lambda *args: calls.append(args[3].tolist()))
    # two sequences of 3 and 4 tokens, on adapters 2 and 0: one row per token
    seq_lens, adapters = torch.tensor([3, 4]), torch.tensor([2, 0])
    lora_ops.sgmv_shrink(
        x, a, torch.zeros(TOKENS, RANK), torch.tensor([0, 3]), seq_lens, adapters, 2, 4, 7, 1.0
    )
    assert calls == [[2, 2, 2, 0, 0, 0, 0]]


def test_shapes_outside_the_plain_case_go_to_vllms_op():
    _, _, b, h, y = _tensors(1)
    one_row = h[:1]  # vLLM's expand broadcasts a single output row over every row of the output
    mine, theirs = y[:, :OUT].clone(), y[:, :OUT].clone()
    lora_cpu.bgmv_expand(one_row, b, mine, torch.tensor([1]), True)
    lora_cpu._ORIGINAL["bgmv_expand"](one_row, b, theirs, torch.tensor([1]), True)
    assert torch.equal(mine, theirs)


@pytest.mark.slow
def test_an_engine_serving_an_adapter_scores_and_samples_as_peft_does_through_the_per_adapter_ops(
    tiny_path, monkeypatch
):
    """vLLM's CPU engine with an adapter (model.lora) against PEFT in transformers on the same weights: the
    prompt log-probs of `score` (prefill) and each sampled token's log-prob (decode), through these ops."""
    from peft import LoraConfig, get_peft_model

    from tests.rollout.rollout_helpers import TINY, reference_logprobs, reference_model
    from tgc_rl.config import JobSpec
    from tgc_rl.rollout.spec import RolloutSpec
    from tgc_rl.rollout.vllm_engine import VLLMEngine
    from tgc_rl.weight_sync.adapter import PEFT_PREFIX, AdapterWeights, peft_name

    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    torch.manual_seed(0)  # B random too (init_lora_weights=False): the adapter changes every log-prob
    policy = get_peft_model(reference_model(tiny_path), config).eval()
    adapter = {
        peft_name(n.removeprefix(PEFT_PREFIX)): p.detach().clone()
        for n, p in policy.named_parameters()
        if "lora_" in n
    }
    spec = JobSpec.parse(
        {
            "model": {
                "source": "random",
                "dtype": "float32",
                "config_overrides": TINY,
                "lora": {"rank": 4, "alpha": 8},
            },
            "sampling": {"max_new_tokens": 12, "max_prompt_tokens": 32, "temperature": 1.0},
            "resources": {"rollout_engine": "vllm", "vllm_memory_fraction": 0.01, "cpus_per_rollout": 1},
        }
    )
    calls = []
    per_adapter = lora_cpu._per_adapter
    monkeypatch.setattr(lora_cpu, "_per_adapter", lambda *a: calls.append(1) or per_adapter(*a))
    engine = VLLMEngine(RolloutSpec.of(spec), tiny_path)
    try:
        engine.update_weights(AdapterWeights.pack(adapter, 4, 8), 1)
        sequence = [1, *range(40, 60)]
        base = reference_logprobs(reference_model(tiny_path), sequence, 5)
        want = reference_logprobs(policy, sequence, 5)
        assert max(abs(a - b) for a, b in zip(base, want, strict=True)) > 0.05  # the adapter matters
        got = engine.score([sequence], 5)[0]
        assert got == pytest.approx(want, abs=1e-4)
        prompts = [[1, *range(70, 80)], [1, *range(90, 96)]]
        for prompt, completions in zip(prompts, engine.generate(prompts, 3, [0, 1]), strict=True):
            for c in completions:
                assert c.logprobs == pytest.approx(
                    reference_logprobs(policy, prompt + c.token_ids, len(prompt)), abs=1e-4
                )
    finally:
        engine.close()
    assert calls  # the engine went through the per-adapter ops, not vLLM's own
