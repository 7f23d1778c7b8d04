"""A multi-turn job end to end (issue 30): Ray, the vLLM engine, environments in worker processes beside the
reward workers, the learner and its checkpoints. The trained sequences are the engine's, token for token. The same
job is a LoRA job (issue 35): FSDP2 learner with a frozen base, vLLM serving the adapter, the canary per sync, and
an IBPO job (issue 30, item 4): incorrect trajectories are revised as new trajectories in the environment (one job
for all three). A multi-turn job killed mid-step and resumed, with the sandbox as its tool, is
test_sandbox_tool_job.py's (which also holds the LoRA canary after a resume)."""

import pytest

from tests.trainer.conftest import read_metrics, tiny_spec
from tgc_rl.trainer.loop import Trainer
from tgc_rl.trainer.multi_turn import MultiTurnSampler

pytestmark = pytest.mark.slow

# `feedback`: a wrong answer (odd text length, tests.trainer.rewards:text_parity) gets a user message and another
# try, so trajectories have 1 or 2 model turns with observations between them, whatever a random model writes;
# two tries leave a quarter of the trajectories wrong, so most groups hold a right and a wrong one (IBPO's)
ENV = {
    "name": "feedback",
    "params": {"tries": 2},
    "bounds": {"max_turns": 3, "max_total_tokens": 256, "max_observation_tokens": 32, "deadline_s": 120},
}
MULTI_TURN_METRICS = (
    "multi_turn/trajectories",
    "multi_turn/turns_per_trajectory",
    "multi_turn/tool_calls",
    "multi_turn/tool_errors",
    "multi_turn/tool_timeouts",
    "multi_turn/observation_tokens",
    "multi_turn/model_tokens",
    "multi_turn/bound_hits/max_turns",
    "multi_turn/bound_hits/deadline",
    "multi_turn/bridge_failures",
    "multi_turn/dropped_trajectories",
    "multi_turn/dropped_groups",
    "timing/env_s",
)
# the revision prompt kept short: a trajectory's transcript and a reference must fit the 256-token context
IBPO = {"mask": "symmetric", "revision_template": "{prompt}\n{response}\n{references}"}
IBPO_METRICS = (
    "ibpo/revisions",
    "ibpo/repaired",
    "ibpo/env_s",
    "ibpo/revision_turns_mean",
    "ibpo/d2_residual",
)


class _Recorder:
    """Every generate() the sampler makes (prompts and what the engine returned), the prompts it was given,
    the groups it returned (with their trajectories) and the batches trained."""

    def __init__(self, monkeypatch):
        self.calls, self.prompt_indices, self.groups, self.batches = [], [], [], []
        sample, build = MultiTurnSampler.generate_groups, Trainer.build_batch
        recorder = self

        def generate_groups(self, prompts, group_size, attempt):
            recorder.prompt_indices.append([p.index for p in prompts])
            real = self.rollout

            class Recording:
                def __getattr__(self, name):
                    return getattr(real, name)

                def generate(self, prompts, n, seeds, sampling=None):
                    outs = real.generate(prompts, n, seeds, sampling)
                    recorder.calls += [(list(p), o[0]) for p, o in zip(prompts, outs, strict=True)]
                    return outs

            self.rollout = Recording()
            try:
                groups, metrics = sample(self, prompts, group_size, attempt)
                recorder.groups += groups
                return groups, metrics
            finally:
                self.rollout = real

        def build_batch(self, groups):
            batch, metrics = build(self, groups)
            recorder.batches.append(batch)
            return batch, metrics

        monkeypatch.setattr(MultiTurnSampler, "generate_groups", generate_groups)
        monkeypatch.setattr(Trainer, "build_batch", build_batch)


def _model_runs(mask: list[float]) -> list[tuple[int, int]]:
    runs, start = [], None
    for t, m in enumerate([*mask, 0.0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            runs.append((start, t))
            start = None
    return runs


def _check_token_exact(batch, calls) -> int:
    """Every run of trained (mask 1) tokens is what the engine sampled when given exactly the tokens before
    it, with the engine's log-probs; returns how many model turns were checked."""
    checked = 0
    for row in range(len(batch)):
        sequence = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
        first = int((batch.attention_mask[row][: batch.prompt_len] == 1).sum())
        mask = batch.response_mask[row].tolist()
        logprobs = batch.rollout_logprobs[row].tolist()
        turns = _model_runs(mask)
        assert turns, "every trained trajectory has a model token"
        for a, b in turns:
            given, sampled = sequence[: first + a], sequence[first + a : first + b]
            match = [c for p, c in calls if p == given and c.token_ids[: b - a] == sampled]
            assert match, f"row {row}: tokens {a}..{b} are not what the engine sampled for that prompt"
            assert [round(x, 5) for x in logprobs[a:b]] == [round(x, 5) for x in match[0].logprobs[: b - a]]
            checked += 1
    return checked


LORA = {"rank": 4, "alpha": 8, "canary_tolerance": 1e-3}  # fp32 on both sides: agreement to ~1e-6


def test_a_multi_turn_lora_ibpo_job_on_vllm_trains_token_exact_revises_in_the_env_and_syncs_the_adapter(
    ray_cluster, tmp_path, monkeypatch
):
    """One job for three features:
    multi-turn trajectories trained token-exact, LoRA (FSDP2 learner with a frozen base, vLLM serving the
    adapter, the canary checking every sync), and IBPO's revisions run as trajectories in the environment."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from tgc_rl.models import model_dir
    from tgc_rl.trainer.main import run

    recorder = _Recorder(monkeypatch)
    spec = {
        "env": ENV,
        "sampling.max_prompt_tokens": 256,
        "model.lora": LORA,
        "optim.lr": 5e-2,  # LoRA's larger learning rate: the adapter moves the policy within a few steps
        "resources.rollout_engine": "vllm",
        "checkpoint.every_steps": 1,
        "ibpo": IBPO,
    }
    assert run(tiny_spec(steps=3, **spec), tmp_path) == "succeeded"

    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["policy/version"] for r in rows] == [1.0, 2.0, 3.0]
    assert recorder.prompt_indices == [[0, 1], [2, 3], [4, 5]]  # the data in order, each prompt once
    for r in rows:
        assert all(name in r for name in MULTI_TURN_METRICS), sorted(set(MULTI_TURN_METRICS) - set(r))
        assert r["multi_turn/trajectories"] == 8 and 1 <= r["multi_turn/turns_per_trajectory"] <= 3
        assert r["multi_turn/model_tokens"] >= r["response/tokens"] > 0
    assert sum(r["multi_turn/observation_tokens"] for r in rows) > 0  # some trajectories took another turn
    turns = sum(_check_token_exact(b, recorder.calls) for b in recorder.batches)
    assert turns > sum(len(b) for b in recorder.batches)  # more model turns than trajectories were checked

    # IBPO: revisions ran as trajectories in the environment workers and the credit kept cancellation
    for r in rows:
        assert all(name in r for name in IBPO_METRICS), sorted(set(IBPO_METRICS) - set(r))
        assert r["ibpo/preserves_cancellation"] == 1.0 and r["ibpo/d2_residual"] < 1e-6
        assert r["ibpo/reward_errors"] == 0 and r["ibpo/skipped_too_long"] == 0
    assert sum(r["ibpo/revisions"] for r in rows) > 0
    assert all(r["ibpo/revision_turns_mean"] >= 1 for r in rows if r["ibpo/revisions"])

    # LoRA: every sync was checked by the canary and agreed
    assert all(0 <= r["sync/canary_logprob_diff"] <= LORA["canary_tolerance"] for r in rows)
    # only the adapter travelled: 2 layers x 7 linears x (A + B), rank 4, float32
    base_spec = tiny_spec(steps=3, **spec)
    base = model_dir(base_spec.model, base_spec.seed)
    full_bytes = sum(t.numel() * t.element_size() for t in load_file(base / "model.safetensors").values())
    assert 0 < rows[-1]["sync/bytes"] < 0.02 * full_bytes

    # the checkpoint's adapter is a PEFT directory that moved the policy away from the base
    adapter = tmp_path / "checkpoints" / "step_3" / "adapter"
    assert not (
        tmp_path / "checkpoints" / "step_3" / "model" / "model.safetensors"
    ).exists()  # no merge asked
    lm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)
    ids = torch.arange(5, 40)[None]
    with torch.no_grad():
        tuned = lm(ids).logits
        with lm.disable_adapter():
            plain = lm(ids).logits
    assert float((tuned - plain).abs().max()) > 1e-3
