"""Presets, knob overrides and their validation; the torch-free control-plane entry points."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rlcore
from rlcore.config import KNOB_NAMES, ObjectiveConfig

REPO = Path(__file__).resolve().parents[2]
REQUIRED = {
    "grpo",
    "dr_grpo",
    "dapo",
    "gspo",
    "gmpo",
    "cispo",
    "rloo",
    "reinforce_pp_baseline",
    "dfpo_min",
    "dfpo_orth",
    "grpo_ar",
    "grpo_lopti",
    "cp_grpo",
}


def test_list_objectives_holds_every_required_preset():
    assert REQUIRED <= set(rlcore.list_objectives())


def test_listing_and_validating_objectives_does_not_import_torch():
    code = (
        "import sys, rlcore; names = rlcore.list_objectives(); rlcore.resolve('cp_grpo', {'clip_high': 0.3}); "
        "assert 'torch' not in sys.modules, 'torch imported'; print(len(names))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == len(rlcore.list_objectives())


def test_unknown_objective_error_lists_the_presets():
    with pytest.raises(ValueError, match="unknown objective 'ppo2'.*cp_grpo"):
        rlcore.get_objective("ppo2")


def test_unknown_knob_error_lists_the_knobs():
    with pytest.raises(ValueError, match="unknown knob.*'clip_hi'.*valid knobs:.*clip_high"):
        rlcore.get_objective("grpo", clip_hi=0.3)


@pytest.mark.parametrize(
    ("knob", "value", "match"),
    [
        ("gate", "sometimes", "not one of ppo, dual, symmetric, none"),
        ("clip_low", 1.5, "must be <= 1.0"),
        ("clip_high", -0.1, "must be >= 0.0"),
        ("kl_coef", "0.1", "expected a number"),
        ("kl_coef", float("nan"), "must be finite"),
        ("dual_clip_c", 1.0, "must be > 1.0"),
        ("const_length", 10.5, "integer token count"),
        ("ar_alpha", True, "expected a number"),
        ("is_max", None, "must not be None"),
    ],
)
def test_bad_knob_values_name_the_knob(knob, value, match):
    with pytest.raises(ValueError, match=f"knob '{knob}'.*{match}"):
        rlcore.get_objective("grpo", **{knob: value})


def test_inconsistent_knobs_are_refused():
    with pytest.raises(ValueError, match="is_max"):
        rlcore.get_objective("cispo", is_min=2.0, is_max=1.5)
    with pytest.raises(ValueError, match="dual"):
        rlcore.get_objective("gmpo", gate="dual")


def test_overrides_reach_the_config():
    cfg = rlcore.get_objective("dapo", clip_high=0.3, const_length=64).config
    assert isinstance(cfg, ObjectiveConfig)
    assert (cfg.clip_high, cfg.const_length, cfg.aggregation) == (0.3, 64, "token_mean")


def test_every_knob_documents_its_default():
    for f in dataclasses.fields(ObjectiveConfig):
        doc = f.metadata["doc"]
        assert "Default" in doc and len(doc) > 40, f.name
    assert set(KNOB_NAMES) <= set(rlcore.describe_knobs().replace(" (default", "\n").split("\n"))


def test_describe_states_the_verdict_and_every_knob():
    text = rlcore.get_objective("grpo").describe()
    assert "does not preserve cancellation" in text and "seq_mean_token_mean" in text
    assert all(f"{k} = " in text for k in KNOB_NAMES)
    assert "preserves cancellation" in rlcore.get_objective("cp_grpo").describe()


@pytest.mark.parametrize(
    ("overrides", "preserves"),
    [
        ({}, True),
        ({"gate": "ppo"}, False),
        ({"aggregation": "seq_mean_token_mean"}, False),
        ({"ratio": "sequence", "gate": "none"}, False),
        ({"ratio": "sequence", "gate": "none", "seq_transform": "min_replace"}, True),
        ({"kl_coef": 0.1, "ar_alpha": 0.3, "lopti_eta": 0.5}, True),
    ],
)
def test_cancellation_verdict_follows_the_knobs(overrides, preserves):
    assert rlcore.preserves_cancellation("cp_grpo", overrides) is preserves
    assert rlcore.get_objective("cp_grpo", **overrides).preserves_cancellation is preserves
