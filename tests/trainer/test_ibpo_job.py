"""IBPO end to end: a tiny job whose step revises incorrect responses through the job's own rollout replicas
and reward pool, shapes the advantages and trains with the cancellation-preserving edit mask; one job (vLLM
engine) carries every check."""

import json
import urllib.request

import pytest

from tests.proc_helpers import wait_until
from tgc_rl.trainer.main import run

from .conftest import read_events, read_metrics, tiny_spec

pytestmark = pytest.mark.slow


# What the issue asks every step to report: revisions attempted, revision success rate, mean phi, share of
# tokens masked, extra generation seconds.
IBPO_REPORTED = (
    "ibpo/revisions",
    "ibpo/success_rate",
    "ibpo/phi_mean",
    "ibpo/masked_token_frac",
    "ibpo/generate_s",
)


def test_ibpo_cp_on_the_vllm_engine_revises_scores_keeps_cancellation_and_reports_every_sink(
    ray_cluster, tmp_path
):
    """One IBPO job for everything its step must do (the checks of a second, hf-engine IBPO job are here too:
    the revisions go through the job's rollout replicas whatever the engine)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # the preset alone turns IBPO on (symmetric mask, lambda 0.6), as the explicit section would
    explicit = tiny_spec(**{"ibpo": {"mask": "symmetric", "lambda_": 0.6}})
    # revisions go through the vLLM CPU replica
    spec = tiny_spec(
        name="ibpo-vllm",
        steps=2,
        objective={"name": "ibpo_cp"},
        **{
            "resources.rollout_engine": "vllm",
            "checkpoint.every_steps": 0,
            "sampling.max_prompt_tokens": 256,
        },
    )
    assert spec.ibpo is not None and spec.ibpo.mask == "symmetric"
    # the preset leaves lambda to the objective's bonus_coef (0.6: `ibpo/lambda` below), the rest is the section's
    assert spec.ibpo.lambda_ is None and spec.ibpo.model_copy(update={"lambda_": 0.6}) == explicit.ibpo
    assert run(spec, tmp_path) == "succeeded"
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["ibpo/eligible_groups"] >= 1 and r["ibpo/revisions"] >= 1  # attempted
        assert r["ibpo/skipped_too_long"] == 0 and r["ibpo/reward_errors"] == 0  # and every one scored
        assert r["ibpo/repaired"] == pytest.approx(r["ibpo/success_rate"] * r["ibpo/revisions"])
        assert r["ibpo/tokens"] >= r["ibpo/revisions"]  # each revision generated at least one token
        assert 0.0 < r["ibpo/generate_s"] <= r["timing/generate_s"]
        assert r["ibpo/lambda"] == pytest.approx(0.6) and r["ibpo/preserves_cancellation"] == 1.0
        assert r["objective/preserves_cancellation"] == 1.0  # the job's claim: the objective with its mask
        assert r["ibpo/symmetric/d2_residual"] <= 1e-6 and r["ibpo/none/d2_residual"] <= 1e-6
        assert 0.0 <= r["ibpo/masked_token_frac"] < 1.0
        assert 0.0 <= r["ibpo/success_rate"] <= 1.0 and r["ibpo/tokens"] > 0
        assert r["ibpo/d2_residual"] <= 1e-6
        assert r.get("diag/d2_residual", 0.0) <= 1e-5 and r.get("diag/d1_gcpr", 0.0) <= 1e-5
    assert any(r["grad_norm"] > 0 for r in rows)
    # phi is rho (0.5) for each repaired response, averaged over all of the step's responses
    n = spec.prompts_per_step * spec.group_size
    assert [r["ibpo/phi_mean"] for r in rows] == pytest.approx([0.5 * r["ibpo/repaired"] / n for r in rows])
    assert any(r["ibpo/repaired"] >= 1 for r in rows)  # a revision of odd length became even

    # TensorBoard: one scalar a step under the same names
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    for key in IBPO_REPORTED:
        assert [(e.step, e.value) for e in events.Scalars(key)] == [
            (r["step"], pytest.approx(r[key], rel=1e-6)) for r in rows
        ]
    # the control plane's `tgc_job_train_metric{metric=...}` is built from the reported step events
    reported = {e["step"]: e["metrics"] for e in read_events(tmp_path) if e["type"] == "step"}
    for r in rows:
        assert {k: reported[r["step"]][k] for k in IBPO_REPORTED} == pytest.approx(
            {k: r[k] for k in IBPO_REPORTED}
        )
    # Ray's Prometheus export of the trainer's gauge: `ray_tgc_train_metric{job="ibpo-vllm",metric="ibpo/..."}`
    last = rows[-1]
    _ray_exports(ray_cluster, "ibpo-vllm", {k: last[k] for k in IBPO_REPORTED})


def _ray_exports(ray, job: str, expected: dict[str, float], timeout: float = 90.0) -> None:
    """Waits until this node's metrics export port (Ray reports every ~10 s) shows `ray_tgc_train_metric` of `job`
    at the `expected` values: an earlier step's values are exported first, and a slow machine scrapes them."""
    from prometheus_client.parser import text_string_to_metric_families

    port = next(n["MetricsExportPort"] for n in ray.nodes() if n["Alive"])
    found: dict[str, float] = {}

    def exported_as_expected() -> bool:
        nonlocal found
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        found = {
            s.labels["metric"]: s.value
            for fam in text_string_to_metric_families(text)
            if fam.name == "ray_tgc_train_metric"
            for s in fam.samples
            if s.labels.get("job") == job and s.labels.get("metric") in expected
        }
        return found == pytest.approx(expected, rel=1e-6)

    if not wait_until(exported_as_expected, timeout=timeout, interval=2.0):
        raise AssertionError(f"Ray exported {json.dumps(found)} for {job} within {timeout} s, not {expected}")
