"""model.lora without a learner: the spec's refusals, the merge, the adapter's PEFT format and its size."""

import pytest
import torch

from tests.learner.conftest import build_spec
from tgc_rl.config import SpecError
from tgc_rl.learner import lora
from tgc_rl.weight_sync.adapter import AdapterWeights, peft_name, target_modules


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"rank": 0}, "model.lora.rank"),
        ({"rank": 257}, "model.lora.rank"),
        ({"alpha": 0}, "model.lora.alpha"),
        ({"dropout": 1.0}, "model.lora.dropout"),
        ({"target_modules": []}, "model.lora.target_modules"),
        ({"target_modules": ["q proj"]}, "model.lora.target_modules"),
        ({"canary_tolerance": 0}, "model.lora.canary_tolerance"),
        ({"rnak": 8}, "model.lora.rnak"),
    ],
)
def test_a_bad_lora_section_is_refused_naming_the_field(value, field):
    with pytest.raises(SpecError, match=field.replace(".", r"\.")):
        build_spec(**{"model.lora": value})


def test_lora_with_a_broadcast_sync_is_refused_naming_both_fields():
    with pytest.raises(SpecError, match=r"model\.lora.*resources\.weight_sync 'object_store'"):
        build_spec(
            **{"model.lora": {}, "resources.weight_sync": "broadcast", "resources.rollout_engine": "vllm"}
        )


def test_defaults_are_all_linear_rank_16_and_no_lora_without_the_section():
    assert build_spec().model.lora is None
    spec = build_spec(**{"model.lora": {}}).model.lora
    assert (spec.rank, spec.alpha, spec.dropout, spec.target_modules) == (16, 32, 0.0, "all-linear")


@pytest.fixture(scope="module")
def wrapped(tiny_model_path):
    """The tiny model wrapped with rank-4 adapters whose B is not zero (so the merge has something to add)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    peft = lora.wrap(lm, build_spec(**{"model.lora": {"rank": 4, "alpha": 8}}).model.lora)
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.05)
    return lm, peft


def test_only_adapter_parameters_train_and_every_linear_but_the_head_is_adapted(wrapped):
    lm, _ = wrapped
    trainable = {n for n, p in lm.named_parameters() if p.requires_grad}
    assert trainable and all(lora.is_adapter(n) for n in trainable)
    assert target_modules([peft_name(n) for n in trainable]) == [
        "down_proj",
        "gate_proj",
        "k_proj",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    ]


def test_merged_weights_equal_peft_merge_and_unload(wrapped, tiny_model_path):
    import copy

    lm, peft = wrapped
    ours = lora.merged(lm.state_dict(), rank=4, alpha=8)
    theirs = copy.deepcopy(peft).merge_and_unload().state_dict()
    assert ours.keys() == theirs.keys()
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], rtol=1e-6, atol=1e-6)
    q = "model.layers.0.self_attn.q_proj"
    assert not torch.equal(ours[f"{q}.weight"], lm.state_dict()[f"{q}.base_layer.weight"])  # B @ A was added


def test_adapter_weights_write_a_peft_directory_that_peft_loads_and_are_a_sliver_of_the_model(
    wrapped, tiny_model_path, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lm, peft = wrapped
    state = {peft_name(n): t.detach() for n, t in lm.state_dict().items() if lora.is_adapter(n)}
    packed = AdapterWeights.pack(state, rank=4, alpha=8)
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32),
        packed.write(tmp_path / "a", str(tiny_model_path)),
    )
    ids = torch.arange(3, 30)[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, peft(ids).logits, rtol=1e-5, atol=1e-5)
    full = sum(t.numel() * t.element_size() for t in lora.merged(lm.state_dict(), 4, 8).values())
    # 2 layers x 7 linears x r (in + out) x 4 bytes = 147 KB against 26 MB: 0.56 %
    assert packed.nbytes / full < 0.01, (packed.nbytes, full)


def test_an_empty_adapter_is_refused():
    with pytest.raises(ValueError, match="no adapter tensors"):
        AdapterWeights.pack({}, rank=4, alpha=8)
