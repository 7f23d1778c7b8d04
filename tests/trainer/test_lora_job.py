"""A LoRA job end to end on the CPU: FSDP2 learner with frozen base, vLLM serving the adapter, canary per sync."""

import pytest
import torch

from .conftest import read_metrics, tiny_spec

pytestmark = pytest.mark.slow

LORA = {"rank": 4, "alpha": 8, "canary_tolerance": 1e-3}  # fp32 on both sides: agreement to ~1e-6


def test_lora_job_syncs_only_the_adapter_checks_every_sync_and_resumes_exactly(ray_cluster, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from services.models import model_dir
    from services.trainer.main import run

    lora = {
        "model.lora": LORA,
        "optim.lr": 5e-2,  # LoRA's larger learning rate: the adapter moves the policy within two steps
        "resources.rollout_engine": "vllm",
        "checkpoint.every_steps": 1,
    }
    spec = tiny_spec(steps=1, **lora)
    assert run(spec, tmp_path) == "succeeded"
    assert run(tiny_spec(steps=2, **lora), tmp_path, resume="latest") == "succeeded"
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    # every sync was checked by the canary (step 2's after the resume's own sync of the checkpoint) and agreed
    assert all(0 <= r["sync/canary_logprob_diff"] <= LORA["canary_tolerance"] for r in rows)
    # only the adapter travelled: 2 layers x 7 linears x (A + B), rank 4, float32
    base = model_dir(spec.model, spec.seed)
    full_bytes = sum(t.numel() * t.element_size() for t in load_file(base / "model.safetensors").values())
    assert 0 < rows[-1]["sync/bytes"] < 0.02 * full_bytes

    # the checkpoint's adapter is a PEFT directory that moved the policy away from the base
    adapter = tmp_path / "checkpoints" / "step_2" / "adapter"
    assert not (
        tmp_path / "checkpoints" / "step_2" / "model" / "model.safetensors"
    ).exists()  # no merge asked
    lm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)
    ids = torch.arange(5, 40)[None]
    with torch.no_grad():
        tuned = lm(ids).logits
        with lm.disable_adapter():
            plain = lm(ids).logits
    assert float((tuned - plain).abs().max()) > 1e-3
