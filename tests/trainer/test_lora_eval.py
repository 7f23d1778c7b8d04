"""`tgc eval --checkpoint` on what a LoRA job saves (issue 35, item 3): its adapter alone on the job's base (vLLM
serves it as a LoRA adapter; the transformers engine gets it merged by peft) and its merged weights, each giving
the greedy answers of the trained adapter applied in-process with peft, not the base model's."""

import json
import shutil

import pytest
import torch
import yaml

from tests.trainer.conftest import tiny_spec
from tgc_rl.cli import main

pytestmark = pytest.mark.slow

# Adam's first step moves every adapter weight by about the learning rate whatever the gradient's size, so the lr
# sets how far the adapter moves the logits. At 5e-2 the random model's greedy answer ("\n" x 8, margin ~0.5)
# stayed the base model's on one CI machine (max logit change 0.67); at 0.3 all 64 of 64 probed prompts change,
# on two seeds (logit change ~1).
JOB = {"model.lora": {"rank": 4, "alpha": 8, "save_merged": True}, "optim.lr": 0.3}


def _greedy(lm, prompts: list[list[int]], max_new: int, eos: int) -> list[list[int]]:
    """Greedy answers by a plain forward per token (no engine code)."""
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(max_new):
                tok = int(lm(torch.tensor([ids])).logits[0, -1].argmax())
                ids.append(tok)
                if tok == eos:
                    break
            out.append(ids[len(prompt) :])
    return out


@pytest.fixture(scope="module")
def lora_checkpoints(ray_cluster, tmp_path_factory):
    """One 1-step LoRA job saving merged weights beside the adapter; its checkpoint, and the same checkpoint
    without the merged weights (what a job with save_merged: false writes: model/ holds the tokenizer only)."""
    from tgc_rl.models import load_tokenizer
    from tgc_rl.trainer.main import run

    run_dir = tmp_path_factory.mktemp("lora_job")
    spec = tiny_spec(steps=1, **JOB)
    assert run(spec, run_dir) == "succeeded"
    merged = run_dir / "checkpoints" / "step_1"
    assert (merged / "model" / "model.safetensors").is_file() and (merged / "adapter").is_dir()
    adapter_only = run_dir / "adapter_only"
    shutil.copytree(merged, adapter_only)
    shutil.rmtree(adapter_only / "model")
    load_tokenizer(spec.model).save_pretrained(adapter_only / "model")
    return spec, merged, adapter_only


def test_tgc_eval_of_a_lora_checkpoint_answers_as_the_trained_adapter_not_as_the_base(
    lora_checkpoints, tmp_path, capsys
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tgc_rl.models import load_tokenizer, model_dir
    from tgc_rl.tasks.export import export_rows, write_rows
    from tgc_rl.trainer.data import encode_item
    from tgc_rl.trainer.evaluation import Evaluator

    spec, merged, adapter_only = lora_checkpoints
    rows = write_rows(export_rows("arithmetic", {"max_operand": 99}, 6), tmp_path / "rows.jsonl")
    data = {**spec.to_dict(), "eval": {"dataset": {"path": str(rows)}}}

    def evaluate(checkpoint, engine: str) -> list[str]:
        job = tmp_path / f"{checkpoint.name}-{engine}.yaml"
        job.write_text(yaml.safe_dump({**data, "resources": {**data["resources"], "rollout_engine": engine}}))
        out = tmp_path / f"{checkpoint.name}-{engine}"
        assert main(["eval", str(job), "--checkpoint", str(checkpoint), "--run-dir", str(out)]) == 0
        lines = (out / "eval" / "step_0.jsonl").read_text().splitlines()
        return [json.loads(line)["response"] for line in lines]

    # the reference: the checkpoint's adapter applied in-process by peft on the job's base model
    tokenizer = load_tokenizer(spec.model)
    evaluated = tiny_spec(steps=0, eval={"dataset": {"path": str(rows)}}, **JOB)
    prompts = Evaluator(evaluated, lambda item: encode_item(tokenizer, spec.model, item)).prompts
    base = AutoModelForCausalLM.from_pretrained(model_dir(spec.model, spec.seed), dtype=torch.float32)
    lm = PeftModel.from_pretrained(base, str(adapter_only / "adapter")).eval()
    ids = [p.token_ids for p in prompts]
    max_new, eos = spec.sampling.max_new_tokens, int(tokenizer.eos_token_id)
    trained = [tokenizer.decode(t, skip_special_tokens=True) for t in _greedy(lm, ids, max_new, eos)]
    with lm.disable_adapter():
        plain = [tokenizer.decode(t, skip_special_tokens=True) for t in _greedy(lm, ids, max_new, eos)]
    assert len(prompts) == 6 and trained != plain  # the adapter changes greedy answers: dropping it shows

    assert evaluate(adapter_only, "vllm") == trained  # vLLM serving the adapter as a LoRA adapter
    assert "its LoRA adapter on the job's base model" in capsys.readouterr().out
    assert evaluate(adapter_only, "hf") == trained  # transformers: the base with the adapter merged by peft
    assert evaluate(merged, "vllm") == trained  # the merged weights, standalone
    assert "its merged LoRA weights" in capsys.readouterr().out
