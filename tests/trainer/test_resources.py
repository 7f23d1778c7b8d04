"""Impossible resource requests fail with a clear message before any actor starts."""

import pytest

from tgc_rl.config import JobSpec
from tgc_rl.resources import ResourceError, check_resources
from tgc_rl.trainer.main import local_capacity


def test_gpus_on_a_cpu_cluster_are_refused():
    spec = JobSpec.parse({"resources": {"gpus_per_learner": 1}})
    with pytest.raises(ResourceError, match="GPU") as e:
        check_resources(spec, {"CPU": 8, "GPU": 0})
    assert "gpus_per_learner" in str(e.value)


def test_too_many_ranks_for_the_cluster_are_refused():
    spec = JobSpec.parse({"resources": {"learner_ranks": 64}})
    with pytest.raises(ResourceError, match=r"needs \d+ CPUs"):
        check_resources(spec, local_capacity() | {"CPU": 8})


def test_a_custom_resource_no_node_has_is_refused_naming_its_role_before_any_actor_starts():
    spec = JobSpec.parse(
        {"resources": {"learner_custom_resources": {"tgc_accel": 1}, "rollout_custom_resources": {"spot": 1}}}
    )
    with pytest.raises(ResourceError, match=r"resources.learner_custom_resources: .* has tgc_accel;"):
        check_resources(spec, {"CPU": 8, "GPU": 0, "spot": 2})
    with pytest.raises(ResourceError, match=r"resources.rollout_custom_resources: .* has spot;"):
        check_resources(spec, {"CPU": 8, "GPU": 0, "tgc_accel": 2})
    check_resources(spec, {"CPU": 8, "GPU": 0, "tgc_accel": 2, "spot": 2})


def test_default_spec_fits_this_machine():
    check_resources(JobSpec(), local_capacity())


def test_actors_keep_large_allocations_on_the_heap_unless_the_operator_says_otherwise(monkeypatch):
    from tgc_rl.trainer.main import actor_env

    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")  # an operator's own choice is kept
    env = actor_env()
    assert env["MALLOC_MMAP_MAX_"] == "0"
    assert env["MALLOC_TRIM_THRESHOLD_"] == "131072"
    assert all(":" not in v for v in env.values())  # Ray's runtime_env cuts values at ':'
