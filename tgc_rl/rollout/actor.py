"""The Ray actor that hosts one rollout engine: it builds the engine in its own worker process (RolloutPool
places the actors), counts the tokens and seconds of its generations, loads the object store's weights, and
relays vLLM's weight-transfer calls (tgc_rl/weight_sync/broadcast.py). `make_engine` is the one place that
knows the engine modules; within this package they import only engine.py and spec.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tgc_rl.batch import Completion
from tgc_rl.rollout.engine import RolloutEngine, Sampling, engine_kind
from tgc_rl.rollout.spec import RolloutSpec
from tgc_rl.startup import set_torch_threads, transformers_without_sklearn


def make_engine(spec: RolloutSpec, model_path: Path | str) -> RolloutEngine:
    """The engine `spec.engine` (resources.rollout_engine) asks for, loaded from the HF directory `model_path`."""
    if engine_kind(spec) == "vllm":
        from tgc_rl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(spec, model_path)
    from tgc_rl.rollout.hf_engine import HFEngine

    return HFEngine(spec, model_path)


class RolloutActor:
    """Runs in its own Ray worker process; the engine (and, for vLLM, its engine core) lives in that process."""

    def __init__(self, spec: RolloutSpec, model_path: str, job_name: str, replica: int, threads: int):
        transformers_without_sklearn()  # before the engine (transformers or vLLM) imports transformers

        set_torch_threads(threads)
        self.name = f"{job_name}-rollout-{replica}"
        self.kind = engine_kind(spec)
        self.engine = make_engine(spec, Path(model_path))
        self.tokens = 0
        self.generate_s = 0.0

    def __repr__(self) -> str:  # the Ray dashboard lists actors by this
        version = getattr(getattr(self, "engine", None), "version", "-")
        return f"RolloutActor({getattr(self, 'name', '?')}, engine={getattr(self, 'kind', '?')}, version={version})"

    def ready(self) -> dict:
        import psutil

        children = [c.pid for c in psutil.Process().children(recursive=True)]
        return {"pid": os.getpid(), "children": children, "engine": self.kind, "version": self.engine.version}

    def generate(
        self, prompts: list[list[int]], n: int, seeds: list[int], sampling: Sampling | None = None
    ) -> list[list[Completion]]:
        t0 = time.perf_counter()
        out = self.engine.generate(prompts, n, seeds, sampling)
        self.generate_s += time.perf_counter() - t0
        self.tokens += sum(len(c.token_ids) for cs in out for c in cs)
        return out

    def update_weights(self, weights_ref: list, version: int) -> dict:
        """`weights_ref` is [ObjectRef] (wrapped so Ray does not resolve it before the timer starts)."""
        import ray

        from tgc_rl.weight_sync.flat import weights_nbytes

        t0 = time.perf_counter()
        weights = ray.get(weights_ref[0])  # same node: a read-only view of the object store, no copy
        t1 = time.perf_counter()
        self.engine.update_weights(weights, version)
        t2 = time.perf_counter()
        nbytes = weights_nbytes(weights)
        del weights  # unpin the object-store buffer
        return {"get_s": t1 - t0, "load_s": t2 - t1, "bytes": nbytes, "version": version}

    def score(self, sequences: list[list[int]], prompt_len: int | list[int]) -> list[list[float]]:
        return self.engine.score(sequences, prompt_len)

    def weight_transfer(self, op: str, payload: dict | None = None, version: int | None = None) -> None:
        transfer = getattr(self.engine, "weight_transfer", None)
        if transfer is None:
            raise RuntimeError(
                f"{self.name}: the {self.kind} engine has no weight-transfer API; resources.weight_sync "
                "'broadcast' needs the vllm engine"
            )
        transfer(op, payload, version)

    def stats(self) -> dict:
        return {"tokens": self.tokens, "generate_s": self.generate_s, "version": self.engine.version}

    def close(self) -> None:
        self.engine.close()
