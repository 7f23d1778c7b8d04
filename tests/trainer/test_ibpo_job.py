"""IBPO end to end: a tiny job whose step revises incorrect responses through the job's own rollout replicas
and reward pool, shapes the advantages and trains with the cancellation-preserving edit mask."""

import pytest

from services.trainer.main import run

from .conftest import read_metrics, tiny_spec

pytestmark = pytest.mark.slow


def test_tiny_job_with_ibpo_revises_scores_and_keeps_cancellation(ray_cluster, tmp_path):
    spec = tiny_spec(
        **{
            "steps": 2,
            "checkpoint.every_steps": 0,
            "sampling.max_prompt_tokens": 256,
            "ibpo": {"mask": "symmetric", "lambda_": 0.6},
        }
    )
    assert run(spec, tmp_path) == "succeeded"
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # parity rewards give mixed groups: every incorrect response of such a group is revised and scored
        assert r["ibpo/eligible_groups"] >= 1 and r["ibpo/revisions"] >= 1
        assert r["ibpo/skipped_too_long"] == 0 and r["ibpo/reward_errors"] == 0
        assert 0.0 <= r["ibpo/success_rate"] <= 1.0 and r["ibpo/tokens"] > 0
        assert r["ibpo/generate_s"] > 0 and r["timing/generate_s"] >= r["ibpo/generate_s"]
        assert r["ibpo/preserves_cancellation"] == 1.0 and r["ibpo/lambda"] == pytest.approx(0.6)
        assert r["ibpo/d2_residual"] <= 1e-6 and r["ibpo/symmetric/d2_residual"] <= 1e-6
        assert r.get("diag/d2_residual", 0.0) <= 1e-5 and r.get("diag/d1_gcpr", 0.0) <= 1e-5
        assert 0.0 <= r["ibpo/masked_token_frac"] < 1.0
    assert any(r["ibpo/repaired"] >= 1 for r in rows)  # a revision of odd length became even
    assert any(r["grad_norm"] > 0 for r in rows)
