"""Fixtures of the rollout tests (helpers live in rollout_helpers.py)."""

from __future__ import annotations

import pytest

from tests.rollout.rollout_helpers import reference_model, rollout_spec


@pytest.fixture(scope="session")
def tiny_path():
    from tgc_rl.models import model_dir

    return model_dir(rollout_spec().model, 0)


@pytest.fixture(scope="session")
def tiny_bf16_path():
    from tgc_rl.models import model_dir

    return model_dir(rollout_spec(dtype="bfloat16").model, 0)


@pytest.fixture(scope="session")
def tiny_state(tiny_path):
    """The tiny model's parameters by HF name (tied output embedding once, as the learner publishes them)."""
    return {k: v.detach().clone() for k, v in reference_model(tiny_path).named_parameters()}
