"""The loop's small seams: one correctness threshold, one seed derivation, real errors for broken invariants,
and an evaluation-only job that stops at the first SIGTERM."""

import json
import os
import signal
import threading
import time
from types import SimpleNamespace

import pytest
import torch

import tgc_rl.tasks.base as task_base
from tgc_rl.batch import Completion
from tgc_rl.config import JobSpec
from tgc_rl.tasks import Score, TaskItem
from tgc_rl.trainer import evaluation
from tgc_rl.trainer import main as trainer_main
from tgc_rl.trainer.data import Prompt, derive_seed
from tgc_rl.trainer.evaluation import _EVAL_SEED_SALT, summarise
from tgc_rl.trainer.ibpo import _SEED_SALT as _REVISION_SEED_SALT
from tgc_rl.trainer.loop import Group, Rollout, Trainer, _rollout_metrics


def _completion(n: int) -> Completion:
    return Completion(token_ids=[1] * n, logprobs=[0.0] * n, finish_reason="stop", version=0)


def test_training_and_evaluation_count_correct_answers_with_the_one_threshold(monkeypatch):
    scores = [Score(1.0), Score(0.6), Score(0.4), Score(0.0)]
    completions = [_completion(2) for _ in scores]
    prompt = Prompt(0, TaskItem(id="0", prompt="q"), [1])
    rollout = Rollout([Group(prompt, completions, scores)], end_position=1)
    batch = SimpleNamespace(response_mask=torch.ones(4, 2), rewards=torch.tensor([s.reward for s in scores]))

    assert summarise(scores, completions, 4)["eval/accuracy"] == 0.25
    assert _rollout_metrics(rollout, batch)["reward/accuracy"] == 0.25  # type: ignore[arg-type]
    monkeypatch.setattr(task_base, "CORRECT_REWARD", 0.5)  # partial credit from 0.5 up: both places follow
    assert summarise(scores, completions, 4)["eval/accuracy"] == 0.5
    assert _rollout_metrics(rollout, batch)["reward/accuracy"] == 0.5  # type: ignore[arg-type]


def test_training_evaluation_and_revision_seeds_never_coincide():
    for job_seed in range(4):
        train = {derive_seed(job_seed, i, attempt) for i in range(2000) for attempt in range(5)}
        held_out = {derive_seed(job_seed, i, _EVAL_SEED_SALT) for i in range(2000)}
        revisions = {
            derive_seed(job_seed, i, row * 104_729 + _REVISION_SEED_SALT)
            for i in range(2000)
            for row in range(8)
        }
        assert len(train) == 2000 * 5 and len(held_out) == 2000 and len(revisions) == 2000 * 8
        assert not train & held_out and not train & revisions and not held_out & revisions
        assert all(0 <= s < 2**31 - 1 for s in train | held_out | revisions)


def test_evaluate_without_an_eval_section_raises_a_real_error():
    with pytest.raises(RuntimeError, match="eval"):  # not an assert: `python -O` must not skip it
        Trainer.evaluate(SimpleNamespace(evaluator=None))  # type: ignore[arg-type]


def test_the_first_sigterm_stops_an_evaluation_only_job(tmp_path, monkeypatch):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread only; a SIGTERM here would end the worker")
    spec = JobSpec.parse({"steps": 0, "eval": {"dataset": {"path": str(rows)}}})
    for var in ("RAY_ADDRESS", "TGC_GRANTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(trainer_main, "init_ray", lambda spec: False)
    finished = []

    def evaluate_slowly(spec, run_dir, checkpoint=None, reporter=None):
        os.kill(os.getpid(), signal.SIGTERM)  # one SIGTERM, as Ray's job stop or a pod's eviction sends
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.05)
        finished.append(True)  # reached only if the signal was ignored
        return {}

    monkeypatch.setattr(evaluation, "run_eval_only", evaluate_slowly)
    state = trainer_main.run(spec, tmp_path / "run")
    assert state == "cancelled" and not finished  # `finished` would mean it sat out the 5 s
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert any(e.get("state") == "cancelled" and "SIGTERM" in e.get("reason", "") for e in events), events
