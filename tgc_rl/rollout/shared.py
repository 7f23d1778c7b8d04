"""One vLLM engine serving several LoRA jobs on one base model (`resources.rollout_sharing: shared`).

The engine is a detached, named Ray actor per (base model, dtype, engine settings, actor resources): the first
job to need it creates it and the others find it (`get_if_exists`, atomic in Ray's control store). A job
*attaches* as a tenant and gets a tenant id (its name plus a random suffix); every call names the tenant, and
the engine serves that tenant's adapter only (tgc_rl/rollout/vllm_engine.py: LoraTenant). A job's sync
replaces its own adapter; the others' stay. A job detaches when its rollout pool shuts down (also when the
job failed or was cancelled); the engine exits once no job has been attached for `grace_s`, so a resume or
the next job on the same base reuses it. The rollout pool drives a tenant through `TenantHandle`, which
looks like a replica's actor handle, so the pool's restart path (a dead engine: create, attach, reload the
latest adapter) and the trainer loop stay as they are.

Calls run one at a time on the engine (vLLM's offline engine is not thread-safe): while one job generates,
another job's generation waits. A driver killed without its `finally` (SIGKILL) leaves its tenant attached;
the engine then stays until its Ray cluster stops.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgc_rl.rollout.spec import RolloutSpec

log = logging.getLogger(__name__)

NAMESPACE = "tgc-shared-rollout"  # Ray namespace of the shared engines: every job's driver finds them there
NAME_PREFIX = "tgc-lora-engine-"
MAX_TENANTS = 4  # adapters one engine serves at once (vLLM max_loras: one preallocated slot each)
GRACE_ENV = "TGC_SHARED_ENGINE_GRACE_S"
DEFAULT_GRACE_S = 60.0
ATTACH_TIMEOUT_S = 120.0  # how long a job retries while a retiring or dead engine's name is released
MAX_DEATHS = 3  # engines found dead (or dying at start) in one attach before it gives up
RETRY_S = 0.5  # between attach tries
_TENANT_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


class EngineRetiring(RuntimeError):
    """The engine is shutting down (idle past its grace); attach to the next one under the same name."""


class EngineFull(RuntimeError):
    """The engine already serves MAX_TENANTS adapters."""


class UnknownTenant(KeyError):
    """A call names a tenant that is not attached (never was, or detached)."""


def grace_seconds() -> float:
    """The idle grace of an engine created now (`TGC_SHARED_ENGINE_GRACE_S`, default 60 s)."""
    raw = os.environ.get(GRACE_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_GRACE_S
    except ValueError:
        raise ValueError(f"{GRACE_ENV}={raw!r}: give the idle grace in seconds, e.g. 60") from None
    if not value >= 0:
        raise ValueError(f"{GRACE_ENV}={raw!r}: the idle grace must be >= 0 seconds")
    return value


@dataclass(frozen=True)
class EngineResources:
    """What the engine actor asks Ray for (the creating job's resources.*_per_rollout) and its torch threads."""

    cpus: float
    gpus: float
    custom: dict[str, float] = field(default_factory=dict)
    threads: int = 1


def engine_settings(spec: RolloutSpec, model_path: Path | str, resources: EngineResources) -> dict:
    """What must be equal for two jobs to share an engine: the base model and tokenizer, the dtype as the spec
    gives it, the context length, vLLM's adapter rank bucket, the KV share and the actor's resources. Not the
    seed (every request carries its own) nor the sampling settings (each tenant samples with its own)."""
    from tgc_rl.rollout.vllm_engine import LORA_RANKS

    s, lora = spec.sampling, spec.model.lora
    if lora is None:
        raise ValueError(
            "resources.rollout_sharing 'shared' needs model.lora (a shared engine serves adapters)"
        )
    return {
        "model": str(model_path),
        "tokenizer": spec.model.tokenizer,
        "dtype": spec.model.dtype,
        "max_model_len": s.max_prompt_tokens + s.max_new_tokens + 1,
        "max_lora_rank": next(r for r in LORA_RANKS if r >= lora.rank),
        "memory_fraction": spec.memory_fraction,
        "cpus": resources.cpus,
        "gpus": resources.gpus,
        "custom": sorted(resources.custom.items()),
        "threads": resources.threads,
    }


def engine_key(spec: RolloutSpec, model_path: Path | str, resources: EngineResources) -> str:
    """16 hex digits of `engine_settings`: the engine's name, so jobs that may share one find the same."""
    text = json.dumps(engine_settings(spec, model_path, resources), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def engine_name(key: str) -> str:
    return NAME_PREFIX + key


def tenant_id(job_name: str) -> str:
    """A tenant's id: the job name (kept readable for logs and adapter names) and a random suffix, so two jobs of
    one name, or a job's next attach, never share an adapter."""
    return f"{_TENANT_CHARS.sub('_', job_name)[:64]}.{uuid.uuid4().hex[:8]}"


class TenantRegistry:
    """Who is attached to an engine and when it may exit (no Ray, no engine: unit-tested on its own)."""

    def __init__(self, capacity: int, grace_s: float, clock: Callable[[], float] = time.monotonic):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity, self.grace_s, self.clock = capacity, grace_s, clock
        self.tenants: dict[str, str] = {}  # tenant id -> job name
        self.retiring = False
        self.idle_since: float | None = clock()  # no tenant yet: an engine nobody attaches to exits too

    def attach(self, job_name: str) -> str:
        if self.retiring:
            raise EngineRetiring("the shared engine is shutting down (idle past its grace); attach again")
        if len(self.tenants) >= self.capacity:
            raise EngineFull(
                f"the shared rollout engine already serves {self.capacity} jobs' adapters (its max_loras); wait for "
                "one to end, or set resources.rollout_sharing 'own' for this job"
            )
        tenant = tenant_id(job_name)
        self.tenants[tenant] = job_name
        self.idle_since = None
        return tenant

    def detach(self, tenant: str) -> bool:
        """False when `tenant` was not attached (a second detach is harmless)."""
        if self.tenants.pop(tenant, None) is None:
            return False
        if not self.tenants:
            self.idle_since = self.clock()
        return True

    def check(self, tenant: str) -> None:
        if tenant not in self.tenants:
            raise UnknownTenant(
                f"tenant {tenant!r} is not attached to this shared engine (detached, or attached to an engine "
                "that has since been replaced)"
            )

    def should_retire(self) -> bool:
        """True once nobody has been attached for the grace; from then on attaches are refused."""
        if self.retiring or self.idle_since is None or self.clock() - self.idle_since < self.grace_s:
            return False
        self.retiring = True
        return True


class SharedLoraEngine:
    """The detached actor: one vLLM engine (the creating job's settings, `MAX_TENANTS` adapter slots) and one
    LoraTenant per attached job. Calls run one at a time; a watchdog thread retires the engine when idle."""

    def __init__(self, spec: RolloutSpec, model_path: str, name: str, threads: int, grace_s: float):
        from tgc_rl.rollout.vllm_engine import VLLMEngine
        from tgc_rl.startup import set_torch_threads, transformers_without_sklearn

        transformers_without_sklearn()
        set_torch_threads(threads)
        self.name = name
        self.engine = VLLMEngine(spec, model_path, max_loras=MAX_TENANTS)
        self.registry = TenantRegistry(MAX_TENANTS, grace_s)
        self.tenants: dict[str, Any] = {}  # tenant id -> LoraTenant
        self.counters: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()  # the watchdog's close against a call in progress
        threading.Thread(target=self._watch, name="idle-watchdog", daemon=True).start()

    def __repr__(self) -> str:  # the Ray dashboard lists actors by this
        return f"SharedLoraEngine({getattr(self, 'name', '?')}, tenants={len(getattr(self, 'tenants', {}))})"

    # -- lifecycle ------------------------------------------------------------------------------------
    def attach(self, job_name: str, spec: RolloutSpec) -> str:
        from tgc_rl.rollout.vllm_engine import LoraTenant

        with self._lock:
            tenant = self.registry.attach(job_name)
            try:
                self.tenants[tenant] = LoraTenant(self.engine, spec, tenant)
            except Exception:
                self.registry.detach(tenant)
                raise
            self.counters[tenant] = {"tokens": 0.0, "generate_s": 0.0}
            log.info("%s: attached %s (%d tenants)", self.name, tenant, len(self.tenants))
            return tenant

    def detach(self, tenant: str) -> bool:
        with self._lock:
            gone = self.tenants.pop(tenant, None)
            self.counters.pop(tenant, None)
            if gone is not None:
                gone.close()
            return self.registry.detach(tenant)

    def describe(self) -> dict:
        """Tenants, the adapter ids vLLM holds, and this process (for tests and `ray` debugging)."""
        with self._lock:
            return {
                "name": self.name,
                "pid": os.getpid(),
                "tenants": dict(self.registry.tenants),
                "adapters": {
                    t: (e.version, getattr(e._lora, "lora_name", None)) for t, e in self.tenants.items()
                },
                "loaded": sorted(self.engine.llm.llm_engine.list_loras()),
            }

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, max(0.05, self.registry.grace_s / 4)))
            with self._lock:
                if not self.registry.should_retire():
                    continue
                log.info("%s: no job attached for %.0f s; exiting", self.name, self.registry.grace_s)
                try:
                    self.engine.close()
                finally:
                    _exit_this_actor()
                return

    # -- a tenant's calls (TenantHandle maps a replica's method `m` to `tenant_m`) -------------------------
    def _tenant(self, tenant: str):
        self.registry.check(tenant)
        return self.tenants[tenant]

    def tenant_ready(self, tenant: str) -> dict:
        import psutil

        with self._lock:
            engine = self._tenant(tenant)
            children = [c.pid for c in psutil.Process().children(recursive=True)]
            return {"pid": os.getpid(), "children": children, "engine": "vllm", "version": engine.version}

    def tenant_generate(self, tenant: str, prompts, n, seeds, sampling=None):
        with self._lock:
            engine = self._tenant(tenant)
            t0 = time.perf_counter()
            out = engine.generate(prompts, n, seeds, sampling)
            c = self.counters[tenant]
            c["generate_s"] += time.perf_counter() - t0
            c["tokens"] += sum(len(x.token_ids) for cs in out for x in cs)
            return out

    def tenant_update_weights(self, tenant: str, weights_ref: list, version: int) -> dict:
        import ray

        from tgc_rl.weight_sync.flat import weights_nbytes

        with self._lock:
            engine = self._tenant(tenant)
            t0 = time.perf_counter()
            weights = ray.get(weights_ref[0])
            t1 = time.perf_counter()
            engine.update_weights(weights, version)  # adapters only (LoraTenant refuses full weights)
            t2 = time.perf_counter()
            nbytes = weights_nbytes(weights)
            del weights
            return {"get_s": t1 - t0, "load_s": t2 - t1, "bytes": nbytes, "version": version}

    def tenant_score(self, tenant: str, sequences, prompt_len):
        with self._lock:
            return self._tenant(tenant).score(sequences, prompt_len)

    def tenant_stats(self, tenant: str) -> dict:
        with self._lock:
            engine = self._tenant(tenant)
            return {**self.counters[tenant], "version": engine.version}

    def tenant_weight_transfer(self, tenant: str, op: str, payload=None, version=None) -> None:
        with self._lock:
            self._tenant(tenant).weight_transfer(op, payload, version)  # refused: see LoraTenant

    def tenant_close(self, tenant: str) -> bool:
        return self.detach(tenant)


def _exit_this_actor() -> None:
    """End this actor's process from the watchdog thread (`ray.actor.exit_actor` works only inside a call):
    ask Ray to kill it, and exit if that did not happen within a few seconds."""
    try:
        import ray

        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
    except Exception as e:
        log.warning("shared engine: ray.kill of itself failed (%s); exiting the process", e)
    time.sleep(5)
    os._exit(0)


class _TenantCall:
    def __init__(self, engine: Any, method: str, tenant: str):
        self.engine, self.method, self.tenant = engine, method, tenant

    def remote(self, *args: Any) -> Any:
        return getattr(self.engine, f"tenant_{self.method}").remote(self.tenant, *args)


class TenantHandle:
    """A job's view of the shared engine with the replica actor's methods (`handle.generate.remote(...)`), each
    call tagged with the job's tenant id."""

    METHODS = frozenset({"ready", "generate", "update_weights", "score", "stats", "close", "weight_transfer"})

    def __init__(self, engine: Any, tenant: str, name: str):
        self.engine, self.tenant, self.name = engine, tenant, name

    def __getattr__(self, method: str) -> _TenantCall:
        if method not in TenantHandle.METHODS:
            raise AttributeError(method)
        return _TenantCall(self.engine, method, self.tenant)

    def __repr__(self) -> str:
        return f"TenantHandle({self.name}, tenant={self.tenant})"


def attach(
    spec: RolloutSpec,
    model_path: str,
    job_name: str,
    resources: EngineResources,
    timeout_s: float = ATTACH_TIMEOUT_S,
) -> TenantHandle:
    """Find or create the engine for `spec` and attach `job_name` to it. An engine that is retiring, or dead but
    still holding its name, is waited out and replaced."""
    import ray
    from ray.exceptions import RayActorError

    name = engine_name(engine_key(spec, model_path, resources))
    grace = grace_seconds()
    deadline = time.monotonic() + timeout_s
    deaths = 0
    while True:
        engine: Any = (
            ray.remote(SharedLoraEngine)
            .options(
                name=name,
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                num_cpus=resources.cpus,
                num_gpus=resources.gpus,
                max_restarts=0,
                max_concurrency=1,
                **({"resources": dict(resources.custom)} if resources.custom else {}),
            )
            .remote(spec, model_path, name, resources.threads, grace)
        )
        try:
            tenant = ray.get(engine.attach.remote(job_name, spec))
        except (RayActorError, EngineRetiring) as e:
            deaths += isinstance(e, RayActorError)
            if time.monotonic() > deadline or deaths > MAX_DEATHS:
                raise RuntimeError(
                    f"could not attach {job_name} to the shared rollout engine {name} within {timeout_s:.0f} s: {e}"
                ) from e
            time.sleep(RETRY_S)
            continue
        return TenantHandle(engine, tenant, name)
