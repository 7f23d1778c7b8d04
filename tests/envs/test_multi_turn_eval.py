"""Held-out evaluation of a multi-turn job (tgc_rl/trainer/evaluation.py): each held-out item runs as whole
trajectories through the job's environment, in worker processes of the real environment host, driven by the
training sampler; pass@k over trajectories, and records that keep the transcript. Only the engine is scripted."""

import json

import pytest

from tgc_rl.batch import Completion
from tgc_rl.config import JobSpec
from tgc_rl.reward.env_host import EnvHost
from tgc_rl.tasks.grants import LOCAL_GRANTS
from tgc_rl.trainer.evaluation import Evaluator

ROWS = [("What is 6 * 7?", "42"), ("What is 12 * 3?", "36"), ("What is 9 * 9?", "81")]


class Engine:
    """A first turn calls the calculator (greedy, or an even sample of a round) or answers a wrong number (an
    odd one); a turn after the tool's result answers with it. Records every request's sampling."""

    def __init__(self, tokenizer):
        self.tokenizer, self.version, self.samplings = tokenizer, 0, []

    def generate(self, prompts, n, seeds, sampling=None):
        assert n == 1 and len(seeds) == len(prompts)
        self.samplings.append(sampling)
        out = []
        for j, ids in enumerate(prompts):
            text = self.tokenizer.decode(ids)
            if " = " in text.rsplit("<|im_start|>tool", 1)[-1] and "<|im_start|>tool" in text:
                reply = "The answer is " + text.rsplit(" = ", 1)[1].split("<|im_end|>")[0].strip()
            elif sampling.temperature == 0 or j % 2 == 0:
                question = text.rsplit("What is ", 1)[1].split("?")[0]
                reply = f"<calc>{question}</calc>"
            else:
                reply = "It is 1"
            ids = self.tokenizer.encode(reply, add_special_tokens=False)
            out.append([Completion(ids, [-0.25] * len(ids), "stop", self.version)])
        return out


@pytest.fixture
def spec(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in ROWS))
    return JobSpec.parse(
        {
            "prompts_per_step": 1,
            "group_size": 2,  # a training step runs 2 trajectories: so does each evaluation chunk
            "sampling": {"max_prompt_tokens": 512, "max_new_tokens": 32},
            "env": {"name": "calculator", "bounds": {"max_total_tokens": 512, "max_observation_tokens": 64}},
            "eval": {
                "dataset": {"path": str(rows)},
                "greedy": False,
                "samples_per_prompt": 2,
                "also_greedy": True,
            },
        }
    )


def test_held_out_items_run_as_whole_trajectories_scored_by_their_reward(spec, tokenizer, tmp_path):
    assert spec.env is not None
    host = EnvHost(spec.task, spec.env, spec.seed, LOCAL_GRANTS)
    slots: set[int] = set()

    class Rewards:
        def env_call(self, env, calls):
            assert env == spec.env  # the job's environment, its bounds included
            slots.update(c.slot for c in calls)
            return host.call(calls)

        def score(self, items, texts):
            raise AssertionError("a trajectory is scored by its environment, not by the single-turn scorer")

    engine = Engine(tokenizer)
    try:
        evaluator = Evaluator(spec, lambda item: tokenizer.encode(item.prompt), tmp_path)
        metrics = evaluator.run(engine, Rewards(), 3, tokenizer)
    finally:
        host.close()

    # sampled pass: per prompt one trajectory used the tool and answered right, one answered wrong at once
    assert metrics["eval/samples"] == 6 and metrics["eval/prompts"] == 3
    assert metrics["eval/accuracy"] == 0.5 and metrics["eval/pass@2"] == 1.0
    assert metrics["eval/turns_per_trajectory"] == 1.5 and metrics["eval/tool_call_frac"] == 0.5
    assert metrics["eval/tool_calls_per_trajectory"] == 0.5 and metrics["eval/errors"] == 0
    # the greedy pass: every trajectory called the tool, then answered right
    assert metrics["eval/greedy/accuracy"] == 1.0 and metrics["eval/greedy/turns_per_trajectory"] == 2.0
    assert {s.temperature for s in engine.samplings} == {0.0, spec.eval.temperature}  # type: ignore[union-attr]
    assert slots == {0, 1}  # never more environment workers than a training step starts

    records = [json.loads(ln) for ln in (tmp_path / "eval" / "step_3.jsonl").read_text().splitlines()]
    assert [(r["mode"], r["reward"]) for r in records] == [("sampled", 1.0), ("sampled", 0.0)] * 3 + [
        ("greedy", 1.0)
    ] * 3
    first = records[0]
    assert first["end_reason"] == "done" and first["turns"] == 2 and first["tool_calls"] == 1
    assert first["response"] == "The answer is 42" and first["id"] == records[1]["id"]
    roles = [m["role"] for m in first["transcript"]]
    assert roles[-4:] == ["user", "assistant", "tool", "assistant"]
    assert first["transcript"][-2]["content"] == "6 * 7 = 42"
    assert records[1]["turns"] == 1 and records[1]["tool_calls"] == 0 and records[1]["status"] == "ok"
