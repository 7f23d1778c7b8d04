"""benchmarks/vs_trl.py's token accounting and medians, on hand-made records (no TRL, no job)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "vs_trl.py"
_SPEC = importlib.util.spec_from_file_location("vs_trl", _PATH)
vs_trl = importlib.util.module_from_spec(_SPEC)
sys.modules["vs_trl"] = vs_trl  # dataclasses look their module up while the file runs
_SPEC.loader.exec_module(vs_trl)


def test_a_step_counts_generated_plus_trained_tokens():
    step = vs_trl.Step(seconds=2.0, generated=100, trained=500)
    assert step.tokens == 600
    assert step.tokens_per_s == 300.0


def test_our_trained_tokens_repeat_each_prompt_once_per_row():
    rows = [{"timing/step_s": 4.0, "response/tokens": 64}, {"timing/step_s": 2.0, "response/tokens": 32}]
    steps = vs_trl.ours_steps(rows, prompt_tokens=[80, 80], group_size=8)
    assert [(s.generated, s.trained) for s in steps] == [(64, 8 * 80 + 64), (32, 8 * 80 + 32)]
    assert steps[1].tokens_per_s == (32 + 640 + 32) / 2.0


def test_our_steps_need_prompt_lengths_for_every_step():
    with pytest.raises(ValueError, match="prompt lengths for 1 steps"):
        vs_trl.ours_steps([{"timing/step_s": 1.0, "response/tokens": 1}] * 2, prompt_tokens=[5], group_size=2)


def test_trl_record_reads_its_prompt_plus_completion_count_as_trained():
    steps = vs_trl.trl_steps({"step_s": [10.0, 8.0], "generated": [60, 64], "trained": [700, 704]})
    assert steps[1] == vs_trl.Step(8.0, 64, 704)
    assert steps[1].tokens == 768


def test_trl_record_with_ragged_lists_is_refused():
    with pytest.raises(ValueError, match="lengths differ"):
        vs_trl.trl_steps({"step_s": [1.0, 2.0], "generated": [1], "trained": [1, 2]})


def test_summary_takes_medians_after_the_warmup():
    steps = [vs_trl.Step(100.0, 10, 10)] + [vs_trl.Step(s, 10, 30) for s in (4.0, 2.0, 8.0)]
    s = vs_trl.summarise(steps, warmup=1)
    assert s["steps"] == 3
    assert s["step_s"] == 4.0
    assert s["tokens_per_s"] == 40 / 4.0  # medians of per-step tokens/s: 10, 20, 5
    assert (s["generated"], s["trained"]) == (10, 30)


def test_summary_without_timed_steps_is_refused():
    with pytest.raises(ValueError, match="none after 2 warm-up"):
        vs_trl.summarise([vs_trl.Step(1.0, 1, 1)] * 2, warmup=2)


def test_ratios_are_ours_over_trl():
    r = vs_trl.ratios({"step_s": 5.0, "tokens_per_s": 300.0}, {"step_s": 20.0, "tokens_per_s": 100.0})
    assert r == {"step_s": 0.25, "tokens_per_s": 3.0}


def test_every_config_names_a_trl_loss_type():
    assert {c.trl["loss_type"] for c in vs_trl.CONFIGS.values()} <= {"dr_grpo", "dapo", "grpo", "bnpo"}
    assert vs_trl.CONFIGS["long"].system_prompt and not vs_trl.CONFIGS["issue"].system_prompt


def test_guard_stores_a_speedup_beside_the_other_baselines(tmp_path):
    path = tmp_path / "baselines.json"
    path.write_text('{"learner_vs_plain": 1.0}')
    assert vs_trl.guard("vs_trl_issue_speedup", 4.0, update=True, path=path)
    assert json.loads(path.read_text()) == {"learner_vs_plain": 1.0, "vs_trl_issue_speedup": 4.0}


def test_guard_flags_a_speedup_more_than_20_percent_under_its_baseline(tmp_path):
    path = tmp_path / "baselines.json"
    path.write_text('{"vs_trl_issue_speedup": 4.0}')
    assert vs_trl.guard("vs_trl_issue_speedup", 3.3, update=False, path=path)
    assert not vs_trl.guard("vs_trl_issue_speedup", 3.1, update=False, path=path)
    assert vs_trl.guard("vs_trl_long_speedup", 1.0, update=False, path=path)  # no baseline: nothing to flag
