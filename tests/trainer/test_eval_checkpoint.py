"""How `tgc eval --checkpoint` reads a checkpoint (full weights, a LoRA job's merged weights or its adapter alone)
and refuses one it cannot load; the PEFT adapter helpers an evaluation loads an adapter with. No Ray: the
evaluation itself is tests/trainer/test_lora_eval.py."""

import json

import pytest
import torch

from tests.trainer.conftest import tiny_spec
from tgc_rl.cli import main
from tgc_rl.trainer.evaluation import CheckpointModel


def _checkpoint(path, spec=None, model_weights=False, adapter=False):
    """A checkpoint directory laid out as the trainer writes one (file contents only where they are read)."""
    path.mkdir(parents=True)
    (path / "model").mkdir()
    (path / "model" / "tokenizer.json").write_text("{}")
    if model_weights:
        (path / "model" / "config.json").write_text("{}")
    if adapter:
        (path / "adapter").mkdir()
        (path / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    state = {"step": 3, "version": 3, "data_position": 6}
    (path / "trainer_state.json").write_text(json.dumps({**state, **({"spec": spec} if spec else {})}))
    return path


def test_a_checkpoint_is_read_as_full_merged_or_adapter_weights(tmp_path):
    lora_job = tiny_spec(**{"model.lora": {"rank": 4, "alpha": 8}}, seed=7).to_dict()
    full = CheckpointModel.read(_checkpoint(tmp_path / "full", model_weights=True))
    assert (full.kind, full.adapter, full.base, full.version) == ("full", None, None, 3)
    merged = CheckpointModel.read(
        _checkpoint(tmp_path / "merged", lora_job, model_weights=True, adapter=True)
    )
    assert (merged.kind, merged.adapter) == ("merged", None)  # the merged weights need no adapter support
    adapter = CheckpointModel.read(_checkpoint(tmp_path / "adapter", lora_job, adapter=True))
    assert adapter.kind == "adapter" and adapter.adapter == tmp_path / "adapter" / "adapter"
    assert adapter.base is not None and adapter.base.lora is not None and adapter.base.lora.rank == 4
    assert adapter.seed == 7  # a `random` base is rebuilt from the job's seed

    # an evaluation spec naming another model takes the adapter's job's model section; the rest is its own
    other = tiny_spec(**{"model.config_overrides.hidden_size": 128}, name="evaluation")
    evaluated = adapter.eval_spec(other)
    assert evaluated.model == adapter.base and evaluated.name == "evaluation"
    assert full.eval_spec(other) is other


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({}, "holds neither model weights"),
        ({"adapter": True}, "without its job's spec"),
        ("no state", r"is not a checkpoint \(no trainer_state.json\)"),
    ],
)
def test_a_directory_without_a_loadable_policy_is_refused_saying_what_is_missing(tmp_path, layout, message):
    if layout == "no state":
        path = _checkpoint(tmp_path / "c", model_weights=True)
        (path / "trainer_state.json").unlink()
    else:
        path = _checkpoint(tmp_path / "c", **layout)
    with pytest.raises(ValueError, match=message):
        CheckpointModel.read(path)


def test_an_adapter_whose_job_had_no_lora_section_is_refused(tmp_path):
    path = _checkpoint(tmp_path / "c", tiny_spec().to_dict(), adapter=True)
    with pytest.raises(ValueError, match="no model.lora"):
        CheckpointModel.read(path)


def test_tgc_eval_refuses_a_path_that_is_not_a_checkpoint_naming_the_option_before_it_starts(
    tmp_path, capsys, monkeypatch
):
    import tgc_rl.trainer.main as trainer_main

    def no_run(*args, **kwargs):
        raise AssertionError("must refuse before the evaluation starts")

    monkeypatch.setattr(trainer_main, "run", no_run)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: x\neval: {{dataset: {{path: {tmp_path / 'rows.jsonl'}}}}}\n")
    assert main(["eval", str(spec), "--checkpoint", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint" in err and "not a checkpoint" in err and "checkpoints/step_<N>" in err


def test_a_peft_directory_reads_back_as_the_adapter_weights_a_sync_sends(tmp_path):
    from tgc_rl.weight_sync.adapter import AdapterWeights, read_peft_dir, write_peft_dir

    torch.manual_seed(0)
    tensors = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 64),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.randn(64, 4),
    }
    read = read_peft_dir(write_peft_dir(tmp_path / "a", tensors, rank=4, alpha=8, base_model="base"))
    assert isinstance(read, AdapterWeights) and (read.rank, read.alpha) == (4, 8)
    state = read.to_state_dict()
    assert state.keys() == tensors.keys() and all(torch.equal(state[k], tensors[k]) for k in tensors)

    config = tmp_path / "a" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "use_rslora": True}))
    with pytest.raises(ValueError, match="use_rslora is not supported"):
        read_peft_dir(tmp_path / "a")
    with pytest.raises(ValueError, match="not a PEFT adapter directory"):
        read_peft_dir(tmp_path)


def test_peft_merges_an_adapter_into_the_base_as_full_weights_that_answer_as_the_adapter(tmp_path):
    """What the transformers engine loads for an adapter-only checkpoint."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from tgc_rl.models import model_dir
    from tgc_rl.weight_sync.adapter import merged_model_state

    spec = tiny_spec()
    base = model_dir(spec.model, spec.seed)
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base), config).save_pretrained(tmp_path / "adapter")

    lm = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    lm.load_state_dict(merged_model_state(base, tmp_path / "adapter"))
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(tmp_path / "adapter"))
    ids = torch.arange(5, 40)[None]
    with torch.no_grad():
        merged, reference = lm(ids).logits, adapted(ids).logits
        with adapted.disable_adapter():
            plain = adapted(ids).logits
    torch.testing.assert_close(merged, reference, rtol=1e-5, atol=1e-5)
    assert float((merged - plain).abs().max()) > 1e-2  # the adapter was folded in, not dropped
