"""The one-command GPU check (scripts/gpu-check.sh) in its CPU variant, so that it cannot rot before a GPU
session runs it: every part runs at tiny shapes and reports a status, finite numbers and passing equality
checks; where packages are missing (a lent GPU machine has no pydantic, Ray or vLLM) it skips what needs them
and names them, and still runs the learner."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rlcore

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402  (benchmarks/gpu_check.py)

# The named packages as if not installed (importing them raises ModuleNotFoundError, find_spec answers None,
# so transformers' probes see them absent too); then the check runs.
BLOCKED_RUN = """
import runpy, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
sys.argv = ["gpu_check.py", *sys.argv[2:]]
runpy.run_path("benchmarks/gpu_check.py", run_name="__main__")
"""


def _numbers(value, path=""):
    """Every number in a JSON value, with where it is."""
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{path}[{i}]")


def _check(cmd: list[str], out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [*cmd, "--device", "cpu", "--tiny", "--threads", "1", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.with_suffix(".json").exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.with_suffix(".json").read_text())


@pytest.mark.slow
def test_cpu_variant_runs_every_part_and_passes(tmp_path):
    proc, report = _check(["scripts/gpu-check.sh"], tmp_path / "check.json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = {p["name"]: p for p in report["parts"]}
    assert list(parts) == list(gpu_check.PARTS)
    for name, p in parts.items():
        assert p["status"] == ("skipped" if name == "e2e_broadcast" else "ok"), (name, p["reason"])
        assert all(p["checks"].values()), (name, p["checks"])
    assert "CUDA" in parts["e2e_broadcast"]["reason"]  # skipped for a reason it names
    # the equality checks ran (a part with no checks could not fail)
    for name in ("shared_prompt", "chunked_logprobs", "rlcore", "flex_backward"):
        assert len(parts[name]["checks"]) >= 4, name
    flex = parts["flex_backward"]["results"]
    assert set(flex["variants"]) == set(gpu_check.FLEX_VARIANTS) and not flex["backward"]  # no CPU backward
    assert all("error" not in row for row in flex["variants"].values())
    assert parts["shared_prompt"]["results"]["tree_nodes"] < parts["shared_prompt"]["results"]["full_tokens"]
    assert len(parts["rlcore"]["results"]["max_rel_err"]) == len(rlcore.list_objectives())
    for name in ("learner_0.5b", "learner_1.5b"):
        r = parts[name]["results"]
        assert r["step_s"] > 0 and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["timed_steps"] >= 1
        assert len(r["step_s_each"]) == r["timed_steps"]
        prof = r["profile"]  # one more step, profiled: where the time went
        assert 0 < prof["busy_frac"] <= 1 and prof["top"]
        assert sum(prof["by_kind_s"].values()) == pytest.approx(prof["busy_s"])
        assert "profiled step: device busy" in parts[name]["summary"]
    bad = [(where, v) for where, v in _numbers(report) if not math.isfinite(v)]
    assert not bad
    text = (tmp_path / "check.txt").read_text()
    assert all(name in text for name in parts) and "PASS" in text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("absent", "expected"),
    [
        # a lent GPU machine: torch, transformers, numpy and numba; no pydantic, Ray, vLLM or FastAPI
        (
            "pydantic,ray,vllm,fastapi",
            {
                "learner_0.5b": "ok",
                "chunked_logprobs": "ok",
                "rollout_hf": "skipped",
                "e2e_broadcast": "skipped",
            },
        ),
        # only torch and transformers (with numpy and pyyaml, which they need)
        (
            "pydantic,ray,vllm,fastapi,numba",
            {"learner_0.5b": "skipped", "rlcore": "skipped", "chunked_logprobs": "ok"},
        ),
    ],
)
def test_parts_that_cannot_import_are_skipped_and_named(tmp_path, absent, expected):
    proc, report = _check(
        [sys.executable, "-c", BLOCKED_RUN, absent, "--parts", ",".join(expected)], tmp_path / "r.json"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = {p["name"]: p for p in report["parts"]}
    assert {n: parts[n]["status"] for n in expected} == expected
    for name, status in expected.items():
        if status == "skipped":
            reason = parts[name]["reason"]
            assert "does not import" in reason and any(m in reason for m in absent.split(",")), reason
    assert report["skipped"] == [n for n, s in expected.items() if s == "skipped"]


def test_a_profiled_step_names_its_ops_by_kind():
    a, b = torch.randn(192, 192), torch.randn(192, 192)
    prof = gpu_check.profile_step(lambda: [(a @ b).exp_() for _ in range(3)], torch.device("cpu"))
    top = {row["op"]: row for row in prof["top"]}
    assert top["aten::mm"]["calls"] == 3 and top["aten::exp_"]["calls"] == 3
    assert prof["by_kind_s"]["matmul"] >= top["aten::mm"]["self_s"] > 0  # with aten::matmul, its parent
    assert 0 < prof["busy_s"] <= prof["wall_s"] and prof["host_top"] == []  # on a CPU `top` is the host


def test_the_learner_settings_are_a_valid_optim_spec():
    """The check builds the learner's optimizer section without pydantic; it must stay an OptimSpec."""
    from tgc_rl.config import OptimSpec

    settings = gpu_check.OptimSettings(micro_batch_size=8, logprob_chunk_tokens=1024)
    assert {f.name for f in dataclasses.fields(settings)} == set(OptimSpec.model_fields)
    assert dataclasses.asdict(settings) == OptimSpec(**dataclasses.asdict(settings)).model_dump()


def test_the_end_to_end_job_is_a_valid_spec(tmp_path):
    from tgc_rl.config import JobSpec

    spec = JobSpec.parse(gpu_check.e2e_spec(tmp_path, tiny=False))
    assert spec.resources.weight_sync == "broadcast" and spec.resources.rollout_engine == "vllm"
    assert spec.steps == 2  # the first sync opens the broadcast group, the second broadcasts


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible here")
def test_a_missing_gpu_is_refused_with_the_cpu_command(tmp_path):
    proc = subprocess.run(
        ["scripts/gpu-check.sh", "--out", str(tmp_path / "r.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "--device cpu --tiny" in proc.stderr
    assert not list(tmp_path.iterdir())  # no report of a check that did not run
