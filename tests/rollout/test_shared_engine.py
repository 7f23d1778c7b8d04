"""The shared LoRA engine's logic without Ray or vLLM (issue 35, item 4): the spec switch and its refusals, which
jobs may share an engine, tenants (attach, detach, capacity, idle grace), the tenant-tagged handle, and that a
tenant's sync replaces only its own adapter. The engine itself runs in tests/trainer/test_lora_tenants.py."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest
import torch

from tests.rollout.rollout_helpers import TINY
from tests.specs import job_spec
from tgc_rl.config import SpecError
from tgc_rl.rollout import RolloutSpec, engine_kind
from tgc_rl.rollout.actor import RolloutActor
from tgc_rl.rollout.shared import (
    DEFAULT_GRACE_S,
    GRACE_ENV,
    EngineFull,
    EngineResources,
    EngineRetiring,
    SharedLoraEngine,
    TenantHandle,
    TenantRegistry,
    UnknownTenant,
    engine_key,
    engine_name,
    grace_seconds,
)
from tgc_rl.weight_sync.adapter import AdapterWeights, peft_name

BASE = {
    "name": "tenant-a",
    "model": {
        "source": "random",
        "dtype": "float32",
        "config_overrides": TINY,
        "lora": {"rank": 4, "alpha": 8},
    },
    "sampling": {"max_new_tokens": 8, "max_prompt_tokens": 32},
    "resources": {"rollout_engine": "vllm", "rollout_sharing": "shared"},
}
RES = EngineResources(cpus=1, gpus=0, custom={}, threads=1)


def spec(**changes):
    return job_spec(BASE, **changes)


# -- the spec switch --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, named",
    [
        ({"resources.rollout_engine": "hf"}, "rollout_engine 'hf'"),
        ({"resources.weight_sync": "broadcast"}, "weight_sync 'broadcast'"),
        ({"resources.rollout_replicas": 2}, "rollout_replicas 2"),
        ({"resources.rollout_placement": "spread"}, "rollout_placement 'spread'"),
    ],
)
def test_shared_rollout_is_refused_in_the_spec_where_it_cannot_work(change, named):
    with pytest.raises(SpecError) as e:
        spec(**change)
    assert "resources.rollout_sharing 'shared'" in str(e.value) and named in str(e.value)


def test_shared_rollout_without_lora_or_vllm_is_refused_before_any_actor_starts(monkeypatch):
    no_lora = spec(**{"model.lora": None})
    with pytest.raises(ValueError, match=r"rollout_sharing 'shared' serves LoRA adapters.*add model.lora"):
        engine_kind(RolloutSpec.of(no_lora))
    monkeypatch.setattr("tgc_rl.rollout.engine.vllm_available", lambda: False)
    auto = spec(**{"resources.rollout_engine": "auto"})
    with pytest.raises(ValueError, match=r"rollout_sharing 'shared' needs the vLLM engine"):
        engine_kind(RolloutSpec.of(auto))


def test_the_switch_reaches_the_replica_spec_and_defaults_to_own_replicas():
    assert RolloutSpec.of(spec()).shared
    own = spec(**{"resources.rollout_sharing": "own"})
    assert own.resources.rollout_sharing == "own" and not RolloutSpec.of(own).shared
    assert job_spec({k: v for k, v in BASE.items() if k != "resources"}).resources.rollout_sharing == "own"


# -- which jobs share an engine ------------------------------------------------------------------------------
def test_jobs_on_one_base_with_the_same_engine_settings_share_an_engine_and_others_do_not():
    def key(res=RES, **changes):
        return engine_key(RolloutSpec.of(spec(**changes)), "/models/base", res)

    same = key()
    # what each request or tenant brings itself: the name, the seed, sampling, the optimizer, a rank in one bucket
    assert (
        key(name="tenant-b", seed=7, **{"sampling.temperature": 0.5, "optim.lr": 0.1, "model.lora.rank": 8})
        == same
    )
    assert (
        key(**{"sampling.max_new_tokens": 6, "sampling.max_prompt_tokens": 34}) == same
    )  # one context length
    different = [
        key(**{"model.dtype": "bfloat16"}),
        key(**{"sampling.max_new_tokens": 16}),  # a longer context
        key(**{"model.lora.rank": 16}),  # another max_lora_rank bucket
        key(**{"resources.vllm_memory_fraction": 0.2}),
        key(EngineResources(cpus=2, gpus=0, custom={}, threads=1)),
        key(EngineResources(cpus=1, gpus=0, custom={"big": 1.0}, threads=1)),
        engine_key(RolloutSpec.of(spec()), "/models/other", RES),
    ]
    assert same not in different and len(set(different)) == len(different)
    assert engine_name(same).startswith("tgc-lora-engine-") and len(same) == 16


def test_the_idle_grace_comes_from_the_environment_with_a_clear_error(monkeypatch):
    monkeypatch.delenv(GRACE_ENV, raising=False)
    assert grace_seconds() == DEFAULT_GRACE_S
    monkeypatch.setenv(GRACE_ENV, "2.5")
    assert grace_seconds() == 2.5
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(GRACE_ENV, bad)
        with pytest.raises(ValueError, match=GRACE_ENV):
            grace_seconds()


# -- tenants ---------------------------------------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_attach_gets_its_own_tenant_id_in_its_job_namespace_up_to_the_capacity():
    reg = TenantRegistry(capacity=2, grace_s=10, clock=Clock())
    a, b = reg.attach("job/a b"), reg.attach("job/a b")  # one name twice (a resume beside the old run)
    assert a != b and a.startswith("job_a_b.") and b.startswith("job_a_b.")
    assert reg.tenants == {a: "job/a b", b: "job/a b"}
    with pytest.raises(EngineFull, match="rollout_sharing 'own'"):
        reg.attach("job-c")
    assert reg.detach(a) and not reg.detach(a)  # a second detach is harmless
    with pytest.raises(UnknownTenant, match="not attached"):
        reg.check(a)
    reg.check(b)
    assert reg.attach("job-c").startswith("job-c.")  # the freed slot


def test_the_engine_retires_only_after_its_grace_with_nobody_attached_and_then_refuses_attaches():
    clock = Clock()
    reg = TenantRegistry(capacity=4, grace_s=10, clock=clock)
    clock.now += 9
    assert not reg.should_retire()
    a = reg.attach("a")
    clock.now += 100
    assert not reg.should_retire()  # attached: never
    b = reg.attach("b")
    reg.detach(a)
    clock.now += 100
    assert not reg.should_retire()  # one job still attached
    reg.detach(b)
    clock.now += 9.9
    assert not reg.should_retire()
    c = reg.attach("c")  # the next job within the grace reuses the engine
    reg.detach(c)
    clock.now += 10
    assert reg.should_retire() and not reg.should_retire()  # once
    with pytest.raises(EngineRetiring, match="attach again"):
        reg.attach("d")


def test_an_engine_nobody_attaches_to_retires_after_its_grace_too():
    clock = Clock()
    reg = TenantRegistry(capacity=1, grace_s=5, clock=clock)
    clock.now += 5
    assert reg.should_retire()


# -- the handle the rollout pool drives -------------------------------------------------------------------------
class Recorder:
    def __init__(self, name):
        self.name, self.calls = name, []

    def remote(self, *args):
        self.calls.append(args)
        return f"ref-{self.name}"


class FakeEngineHandle:
    def __getattr__(self, name):
        rec = Recorder(name)
        self.__dict__[name] = rec
        return rec


def test_the_tenant_handle_has_a_replicas_methods_and_tags_every_call_with_its_tenant():
    engine = FakeEngineHandle()
    handle = TenantHandle(engine, "job-a.1234abcd", "tgc-lora-engine-x")
    assert handle.generate.remote([[1, 2]], 2, [0], None) == "ref-tenant_generate"
    assert engine.tenant_generate.calls == [("job-a.1234abcd", [[1, 2]], 2, [0], None)]
    handle.update_weights.remote(["ref"], 3)
    assert engine.tenant_update_weights.calls == [("job-a.1234abcd", ["ref"], 3)]
    with pytest.raises(AttributeError):
        handle.attach  # noqa: B018 - only a replica's methods, never the engine's own (attach, detach)
    # every method the pool calls on a replica exists for a tenant, with the tenant id first
    replica = {m for m in vars(RolloutActor) if not m.startswith("_")}
    assert TenantHandle.METHODS <= replica
    assert replica - TenantHandle.METHODS == set()
    for method in TenantHandle.METHODS:
        assert callable(getattr(SharedLoraEngine, f"tenant_{method}"))


# -- one tenant's sync replaces only its own adapter ---------------------------------------------------------------
class FakeVLLM:
    """What LoraTenant uses of vLLM's engine: add_lora / remove_lora / list_loras."""

    def __init__(self):
        self.loras: dict[int, str] = {}

    def add_lora(self, request) -> bool:
        assert request.lora_int_id not in self.loras, "an adapter id was used twice"
        self.loras[request.lora_int_id] = request.lora_name
        return True

    def remove_lora(self, lora_id: int) -> bool:
        return self.loras.pop(lora_id, None) is not None


class FakeBase:
    def __init__(self):
        import itertools
        from types import SimpleNamespace

        self.vllm = FakeVLLM()
        self.llm = SimpleNamespace(llm_engine=self.vllm)
        self.eos_id, self.cuda, self.model_path = 2, False, "/models/base"
        self.next_lora_id = itertools.count(1).__next__


@dataclass(frozen=True)
class FakeLoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


@pytest.fixture
def no_vllm(monkeypatch):
    """vLLM's LoRARequest without importing vLLM (tens of seconds): the tenant logic is what is tested."""
    module = types.ModuleType("vllm.lora.request")
    module.LoRARequest = FakeLoRARequest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.lora.request", module)


def adapter(value: float) -> AdapterWeights:
    names = [peft_name(f"model.layers.0.self_attn.q_proj.lora_{p}.default.weight") for p in "AB"]
    return AdapterWeights.pack({n: torch.full((4, 4), value) for n in names}, rank=4, alpha=8)


def test_a_tenants_sync_replaces_its_own_adapter_and_no_other(no_vllm):
    from tgc_rl.rollout.vllm_engine import LoraTenant

    base = FakeBase()
    a = LoraTenant(base, RolloutSpec.of(spec()), "job-a.00000001")  # type: ignore[arg-type]
    b = LoraTenant(base, RolloutSpec.of(spec(name="job-b")), "job-b.00000002")  # type: ignore[arg-type]
    a.update_weights(adapter(0.1), 1)
    b.update_weights(adapter(0.2), 1)
    a.update_weights(adapter(0.3), 2)
    assert a.version == 2 and b.version == 1
    assert sorted(base.vllm.loras.values()) == ["job-a.00000001-v2-2", "job-b.00000002-v1-1"]
    assert a._lora is not None and b._lora is not None
    assert base.vllm.loras[a._lora.lora_int_id].startswith("job-a.") and a._lora.lora_int_id == 3
    assert base.vllm.loras[b._lora.lora_int_id].startswith("job-b.")
    a.close()
    assert list(base.vllm.loras.values()) == ["job-b.00000002-v1-1"]  # a's detach leaves b's adapter
    with pytest.raises(ValueError, match="LoRA jobs only"):
        LoraTenant(base, RolloutSpec.of(spec(**{"model.lora": None})), "job-c.3")  # type: ignore[arg-type]


def test_a_tenant_refuses_full_weights_and_broadcasts_which_would_replace_every_tenants_base(no_vllm):
    from tgc_rl.rollout.vllm_engine import LoraTenant

    base = FakeBase()
    a = LoraTenant(base, RolloutSpec.of(spec()), "job-a.00000001")  # type: ignore[arg-type]
    full = AdapterWeights.pack({"model.embed_tokens.weight": torch.zeros(4, 4)}, 4, 8)
    with pytest.raises(TypeError, match="adapters only"):
        a.update_weights(full.to_state_dict(), 1)
    with pytest.raises(RuntimeError, match="weight_sync 'broadcast'"):
        a.weight_transfer("init", {})
    assert a.version == 0 and base.vllm.loras == {}


# -- attach: found or created by name, retried past a retiring or dead engine ----------------------------------
class FakeActorClass:
    """What `ray.remote(SharedLoraEngine)` gives: options(...).remote(...) -> a handle; every call records."""

    def __init__(self):
        self.options_seen: list[dict] = []

    def options(self, **options):
        self.options_seen.append(options)
        return self

    def remote(self, *args):
        return FakeEngineHandle()


def fake_ray(monkeypatch, outcomes):
    """ray.remote / ray.get answering attach calls with `outcomes` in turn (an exception is raised)."""
    import ray

    actor_class = FakeActorClass()
    monkeypatch.setattr(ray, "remote", lambda cls: actor_class)
    answers = iter(outcomes)

    def get(ref):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr("tgc_rl.rollout.shared.RETRY_S", 0.0)
    return actor_class


def test_attach_finds_or_creates_the_engine_by_name_and_retries_past_a_retiring_or_dead_one(monkeypatch):
    from ray.exceptions import RayActorError

    from tgc_rl.rollout.shared import NAMESPACE, attach

    monkeypatch.setenv(GRACE_ENV, "7")
    rspec = RolloutSpec.of(spec())
    actor_class = fake_ray(monkeypatch, [EngineRetiring("retiring"), RayActorError(), "tenant-a.0000abcd"])
    handle = attach(rspec, "/models/base", "tenant-a", RES)
    name = engine_name(engine_key(rspec, "/models/base", RES))
    assert (handle.tenant, handle.name) == ("tenant-a.0000abcd", name)
    assert len(actor_class.options_seen) == 3  # asked by name again after each failure
    for options in actor_class.options_seen:
        assert options["name"] == name and options["namespace"] == NAMESPACE
        assert options["get_if_exists"] and options["lifetime"] == "detached"
        assert options["max_concurrency"] == 1 and options["max_restarts"] == 0 and options["num_cpus"] == 1
        assert "resources" not in options  # no custom resources asked for


def test_attach_gives_up_on_engines_that_keep_dying_and_passes_a_full_engine_on(monkeypatch):
    from ray.exceptions import RayActorError

    from tgc_rl.rollout.shared import MAX_DEATHS, attach

    rspec = RolloutSpec.of(spec())
    fake_ray(monkeypatch, [RayActorError() for _ in range(MAX_DEATHS + 1)])
    with pytest.raises(
        RuntimeError, match=r"could not attach tenant-a to the shared rollout engine tgc-lora-engine-"
    ):
        attach(rspec, "/models/base", "tenant-a", RES)
    fake_ray(monkeypatch, [EngineFull("already serves 4 jobs' adapters")])
    with pytest.raises(EngineFull, match="already serves"):
        attach(rspec, "/models/base", "tenant-a", RES)
