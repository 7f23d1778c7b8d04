"""The one-command GPU check (scripts/gpu-check.sh): what tgc-rl's learner and rollout do on one CUDA device.

Parts, each with its own time budget (the defaults keep the whole under 8 minutes on an H100):
  device              GPU, driver, torch / CUDA / transformers versions, which optional packages import
  matmul_peak         the measured matmul peak in the learner's compute dtype (bf16 on a GPU): MFU's denominator
  learner_0.5b/1.5b   tgc_rl.learner.Learner (FSDP2, NCCL, world size 1) on a random Qwen2 of that shape in
                      bf16: step time, tokens/s, MFU (model FLOPs / step time / peak), peak memory, and one
                      more step under torch.profiler (device-busy share, kernel time by kind, top kernels)
  shared_prompt       the shared-prompt forward (one token tree per group; above 1024 nodes FlexAttention on
                      CUDA, the block kernel on CPU)
                      vs one forward per row at prompt 2k / response 2k: log-probs and gradients equal (float32),
                      speedup (bf16)
  tree_threshold      the dense L x L tree mask vs the tree kernel (FlexAttention on CUDA, the block kernel on CPU)
                      on the 0.5B model by tree size, each timed pass a batch of new lengths as in training: where
                      the kernel starts to win (optim.dense_tree_max_tokens)
  flex_backward       FlexAttention on one tree of the learner's shape by variant (grouped-query as the learner
                      calls it, K/V expanded to every head, backward block sizes): equal outputs and gradients,
                      forward and backward times (on a CPU eager forward only: no FlexAttention backward there)
  chunked_logprobs    the chunked log-prob head at vocab 151936 vs whole logits: values and gradients equal,
                      peak memory of each
  rlcore              every objective's loss, its token gradients and the cancellation diagnostics on the device
                      against CPU
  rollout_hf          the transformers rollout engine's tokens/s (it decodes on the CPU: it has no device option)
  e2e_broadcast       one job of two steps with vLLM, Ray and the NCCL weight broadcast (second step broadcasts)

A part whose imports fail (machines lent for GPU work may lack vLLM, Ray, pydantic or numba) is skipped and
listed with the reason; one that raises is marked failed; the others still run. Exit status 1 when any
equality check fails or any part fails. `--device cpu --tiny` runs the same parts at tiny shapes (the test
suite runs it: tests/benchmarks/test_gpu_check.py). Own imports: torch and transformers only.

    scripts/gpu-check.sh                                   # writes benchmarks/gpu/<device>-<date>.{json,txt}
    scripts/gpu-check.sh --device cpu --tiny --out /tmp/check.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import gc
import importlib
import importlib.metadata
import json
import math
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # rlcore and tgc_rl travel as source with the working tree
sys.path.insert(0, str(ROOT / "benchmarks"))  # learner_flops: the learner step's model FLOPs

VOCAB = 151936  # Qwen2's vocabulary: the head's size matters for memory and MFU
SPECIAL = {"<pad>": 0, "<eos>": 1, "<unk>": 2}  # the check's word-level tokenizer (no hub)
PAD, EOS = SPECIAL["<pad>"], SPECIAL["<eos>"]

# Qwen2-0.5B / -1.5B shapes (their published configs), random weights; tiny shapes for the CPU variant.
SHAPE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)
SHAPES = {"0.5b": (896, 4864, 24, 14, 2), "1.5b": (1536, 8960, 28, 12, 2)}
TINY_SHAPES = {"0.5b": (64, 128, 2, 2, 1), "1.5b": (96, 192, 2, 3, 1)}


@dataclass(frozen=True)
class Sizes:
    """Every shape the parts use; `--tiny` swaps the whole set, the flags below change single entries."""

    matmul_n: int = 8192
    vocab: int = VOCAB  # the models' vocabulary (the chunked_logprobs part always uses VOCAB)
    groups: int = 4  # learner batch: groups x group_size rows, prompt + up to response tokens each
    group_size: int = 8
    prompt: int = 512
    response: int = 1024
    steps: int = 3  # timed learner steps (after one untimed warm-up)
    tree_prompt: int = 2048  # the shared-prompt part: one group of tree_group responses
    tree_response: int = 2048
    tree_group: int = 4
    tree_groups: int = 1
    tree_eq_layers: int = 4  # layers of the float32 equality model (the speed model has all of them)
    threshold_prompt: int = 128  # tree_threshold: one group of `group_size` responses per tree size
    # longest response of each tree size; trees ~0.75x 8R nodes
    threshold_responses: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    head_tokens: int = 8192  # chunked log-probs: hidden rows through the 152k head
    chunk_tokens: int = 1024
    rl_groups: int = 16  # rlcore: groups x group_size rows of rl_tokens
    rl_group_size: int = 8
    rl_tokens: int = 512
    gen_prompts: int = 4  # rollout_hf: prompts x samples, new tokens each
    gen_samples: int = 4
    gen_tokens: int = 64


TINY = Sizes(
    matmul_n=256,
    vocab=4096,
    groups=2,
    group_size=4,
    prompt=16,
    response=16,
    steps=1,
    tree_prompt=24,
    tree_response=24,
    tree_group=4,
    tree_groups=2,
    tree_eq_layers=2,
    threshold_prompt=8,
    threshold_responses=(8, 32),
    head_tokens=64,
    chunk_tokens=16,
    rl_groups=4,
    rl_group_size=4,
    rl_tokens=16,
    gen_prompts=2,
    gen_samples=2,
    gen_tokens=8,
)

# Seconds per part (the whole default run stays under 8 minutes on an H100); a timed loop stops early when its
# part is over budget, and the report flags a part that ran past it.
BUDGETS = {
    "device": 10,
    "matmul_peak": 20,
    "learner_0.5b": 70,
    "learner_1.5b": 110,
    "shared_prompt": 70,
    "tree_threshold": 90,
    "flex_backward": 90,
    "chunked_logprobs": 30,
    "rlcore": 40,
    "rollout_hf": 40,
    "e2e_broadcast": 150,
}


@dataclass
class Part:
    name: str
    budget_s: float
    status: str = "skipped"  # ok | skipped | failed
    reason: str = ""
    seconds: float = 0.0
    summary: str = ""
    results: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)  # equality checks: all must hold

    def over_budget(self, since: float) -> bool:
        return time.perf_counter() - since > self.budget_s


@dataclass
class Context:
    device: torch.device
    sizes: Sizes
    tiny: bool
    work: Path  # models are written here (a temporary folder)
    peak_flops: float | None = None  # measured by matmul_peak
    # the learner parts' optim.dense_tree_max_tokens (None: by device)
    dense_tree_max_tokens: int | None = None
    models: dict[str, Path] = field(default_factory=dict)


@dataclass(frozen=True)
class OptimSettings:
    """The learner's optimizer section (tgc_rl.config.OptimSpec's fields, the values this check runs with):
    a plain object so that a Learner runs where pydantic is absent. The suite checks it still validates as
    an OptimSpec with the same fields (tests/benchmarks/test_gpu_check.py)."""

    micro_batch_size: int
    logprob_chunk_tokens: int
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    schedule: str = "constant"
    grad_clip: float = 1.0
    micro_batch_tokens: int | None = None
    ppo_epochs: int = 1
    mini_batches: int = 1
    activation_checkpointing: bool = False
    shared_prompt_forward: bool = True
    dense_tree_max_tokens: int | None = None  # by device


# -- helpers ---------------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    """Peak GPU memory allocated since the last reset_peak; on CPU the process's peak RSS (never reset)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


# Kernel name patterns by kind, checked in order (the first match wins): what a profiled step spent its time on.
KERNEL_KINDS = (
    ("communication", re.compile(r"nccl|gloo|all_?gather|reduce_?scatter|all_?reduce|broadcast", re.I)),
    ("attention", re.compile(r"flash|flex|attention|sdpa|fmha|triton_tem", re.I)),
    ("matmul", re.compile(r"gemm|matmul|\bmm\b|addmm|bmm|cutlass|nvjet|sm90_xmma|cublas|linear", re.I)),
    ("optimizer", re.compile(r"adam|foreach|multi_tensor|fused_optim", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy_|to_copy|cat\b|CatArrayBatched", re.I)),
)


def profile_step(fn: Callable[[], Any], device: torch.device, top: int = 12) -> dict[str, Any]:
    """One call of `fn` under torch.profiler: the wall time, how much of it the device was busy (the rest is the
    host: Python, launches, syncs), busy time by kernel kind, and the `top` ops by self device time. On a CPU the
    ops' self CPU time stands in for device time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        fn()
        sync(device)
        wall_s = time.perf_counter() - t0

    def self_us(e: Any) -> float:
        if cuda:
            device_us = getattr(e, "self_device_time_total", None)  # older torch: self_cuda_time_total
            return float(device_us if device_us is not None else getattr(e, "self_cuda_time_total", 0.0))
        return float(e.self_cpu_time_total)

    events = prof.key_averages()
    # On CUDA the kernels themselves (a CPU op's self device time repeats its kernels' time); on a CPU the ops.
    rows = [e for e in events if self_us(e) > 0 and (e.device_type == DeviceType.CUDA or not cuda)]
    host = sorted(
        (e for e in events if e.device_type == DeviceType.CPU and cuda),  # on a CPU `rows` are the host's ops
        key=lambda e: -e.self_cpu_time_total,
    )
    busy_us = sum(self_us(e) for e in rows)
    kinds: dict[str, float] = {}
    for e in rows:
        kind = next((k for k, pat in KERNEL_KINDS if pat.search(e.key)), "other")
        kinds[kind] = kinds.get(kind, 0.0) + self_us(e)
    rows.sort(key=self_us, reverse=True)
    return {
        "wall_s": wall_s,
        "busy_s": busy_us / 1e6,
        "busy_frac": min(busy_us / 1e6 / wall_s, 1.0) if wall_s > 0 else None,
        "by_kind_s": {k: v / 1e6 for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "top": [{"op": e.key[:120], "self_s": self_us(e) / 1e6, "calls": int(e.count)} for e in rows[:top]],
        "host_top": [
            {"op": e.key[:120], "self_cpu_s": e.self_cpu_time_total / 1e6, "calls": int(e.count)}
            for e in host[:top]
        ],
    }


def max_rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| relative to max |want|: float rounding shows as ~1e-7..1e-5, a wrong result as ~1."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    scale = float(want.abs().max()) if want.numel() else 0.0
    return float((got - want).abs().max()) / max(scale, 1e-30) if want.numel() else 0.0


def qwen2_config(shape: tuple[int, ...], vocab: int, layers: int | None = None):
    from transformers import Qwen2Config

    fields = dict(zip(SHAPE_FIELDS, shape, strict=True)) | ({"num_hidden_layers": layers} if layers else {})
    return Qwen2Config(
        vocab_size=vocab,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=EOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        attn_implementation="sdpa",
        **fields,
    )


def random_lm(cfg, device: torch.device, dtype: torch.dtype, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(
        device
    ):  # initialised where it will run: a GPU draws 1.5B weights in well under a second
        lm = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return lm.eval()


def save_tokenizer(out: Path) -> None:
    """A word-level tokenizer that knows only pad/eos/unk: the engines need its special ids, not its words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=dict(SPECIAL), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(out)


def model_path(ctx: Context, name: str) -> Path:
    """A Hugging Face folder (config, bf16 weights, tokenizer) of the random Qwen2 of that shape, built once."""
    if name not in ctx.models:
        shapes = TINY_SHAPES if ctx.tiny else SHAPES
        out = ctx.work / f"qwen2-{name}"
        lm = random_lm(qwen2_config(shapes[name], ctx.sizes.vocab), ctx.device, torch.bfloat16)
        lm.generation_config.pad_token_id = PAD
        lm.save_pretrained(out)
        save_tokenizer(out)
        del lm
        free(ctx.device)
        ctx.models[name] = out
    return ctx.models[name]


def make_batch(
    groups: int, group_size: int, prompt: int, response: int, vocab: int, seed: int = 0, common: int = 4
):
    """A rollout batch of the trainer's layout: `groups` prompts of exactly `prompt` tokens, `group_size`
    responses each of `response`/2..`response` tokens whose first `common` tokens agree (a shared node),
    rewards alternating 0/1 (every group informative), cp_grpo advantages."""
    import rlcore
    from tgc_rl.batch import Completion, collate

    gen = torch.Generator().manual_seed(seed)
    prompts, comps, gids, rewards = [], [], [], []
    for g in range(groups):
        p = torch.randint(3, vocab, (prompt,), generator=gen).tolist()
        head = torch.randint(3, vocab, (common,), generator=gen).tolist()
        for i in range(group_size):
            n = int(torch.randint(max(response // 2, common + 1), response + 1, (1,), generator=gen))
            tokens = head + torch.randint(3, vocab, (n - common,), generator=gen).tolist()
            prompts.append(p)
            comps.append(Completion(tokens, (-torch.rand(n, generator=gen)).tolist(), "stop", 0))
            gids.append(g)
            rewards.append(float(i % 2))
    r = torch.tensor(rewards)
    batch = collate(prompts, comps, gids, r, pad_id=PAD)
    adv = rlcore.get_objective("cp_grpo").advantages(r, batch.group_ids, batch.response_mask)
    return batch.with_advantages(adv)


# -- parts -----------------------------------------------------------------------------------------------


def installed_packages() -> dict[str, str | None]:
    """The installed version of each package a part may need (None: absent), read without importing them."""
    out: dict[str, str | None] = {}
    for name in ("transformers", "numba", "numpy", "pydantic", "pyyaml", "ray", "vllm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def part_device(ctx: Context, part: Part) -> None:
    r = part.results
    r["torch"] = torch.__version__
    r["python"] = platform.python_version()
    r["host_cpus"] = os.cpu_count()
    r["packages"] = installed_packages()
    if ctx.device.type == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        r["name"] = props.name
        r["memory_gib"] = round(props.total_memory / 2**30, 1)
        r["sm_count"] = props.multi_processor_count
        r["capability"] = f"{props.major}.{props.minor}"
        r["cuda"] = torch.version.cuda
        r["driver"] = nvidia_driver()
    else:
        r["name"] = platform.processor() or platform.machine()
        r["driver"] = None
    part.summary = (
        f"{r['name']}, driver {r['driver']}, torch {r['torch']}, transformers {r['packages']['transformers']}"
    )


def nvidia_driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def compute_dtype(device: torch.device) -> torch.dtype:
    """What the learner computes in when the spec asks for bf16 (tgc_rl.learner.sharding decides)."""
    from tgc_rl.learner.sharding import compute_dtype as learner_dtype

    return learner_dtype("bfloat16", device)


def part_matmul_peak(ctx: Context, part: Part) -> None:
    n, dtype = ctx.sizes.matmul_n, compute_dtype(ctx.device)
    a = torch.randn(n, n, device=ctx.device, dtype=dtype)
    b = torch.randn(n, n, device=ctx.device, dtype=dtype)
    for _ in range(3):
        a @ b
    times, t0 = [], time.perf_counter()
    while len(times) < 10 and not (len(times) >= 3 and part.over_budget(t0)):
        times.append(timed(lambda: a @ b, ctx.device))
    ctx.peak_flops = 2 * n**3 / statistics.median(times)
    part.results.update(n=n, dtype=str(dtype).removeprefix("torch."), tflops=ctx.peak_flops / 1e12)
    part.summary = (
        f"{ctx.peak_flops / 1e12:.3g} TFLOP/s ({n}^3 {part.results['dtype']}, median of {len(times)})"
    )


def learner_spec(ctx: Context, micro_batch_size: int, **optim: Any):
    from rlcore import resolve as rlcore_resolve
    from tgc_rl.learner.spec import LearnerSpec

    s = ctx.sizes
    settings = OptimSettings(micro_batch_size=micro_batch_size, logprob_chunk_tokens=s.chunk_tokens, **optim)
    return LearnerSpec(
        objective="cp_grpo",
        objective_config=rlcore_resolve("cp_grpo"),
        optim=settings,  # type: ignore[arg-type]  # OptimSpec's fields, no pydantic (see OptimSettings)
        model_dtype="bfloat16",
        tokenizer=None,
        steps=1000,
        seed=0,
        group_size=s.group_size,
        temperature=1.0,
        max_new_tokens=s.response,
        save_optimizer=False,
        gpus=1.0 if ctx.device.type == "cuda" else 0.0,
        threads=torch.get_num_threads(),
    )


def part_learner(name: str) -> Callable[[Context, Part], None]:
    def run(ctx: Context, part: Part) -> None:
        from learner_flops import step_work  # benchmarks/learner_flops.py: the step's model FLOPs

        from tgc_rl.learner.learner import Learner

        s = ctx.sizes
        path = model_path(ctx, name)
        spec = learner_spec(
            ctx, micro_batch_size=s.group_size, dense_tree_max_tokens=ctx.dense_tree_max_tokens
        )
        learner = Learner(spec, path)
        try:
            batches = [
                make_batch(s.groups, s.group_size, s.prompt, s.response, s.vocab, seed=i)
                for i in range(s.steps + 1)
            ]
            learner.train_step(batches[0])  # warm-up: allocator, kernels, numba's diagnostics
            reset_peak(ctx.device)
            times, tokens_per_s, t0 = [], [], time.perf_counter()
            out: dict[str, float] = {}
            for b in batches[1:]:
                times.append(timed(lambda b=b: out.update(learner.train_step(b)), ctx.device))
                tokens_per_s.append(out["tokens_per_s"])
                if part.over_budget(t0):
                    break
            step_s = statistics.median(times)
            cfg = learner.policy.lm.config
            work = step_work(cfg, batches[1], s.group_size, shared=learner.policy.prefix_tree)
            r = part.results
            r.update(
                shape={k: getattr(cfg, k) for k in (*SHAPE_FIELDS, "vocab_size")},
                params_b=sum(p.numel() for p in learner.policy.lm.parameters()) / 1e9,
                compute_dtype=str(learner.compute_dtype).removeprefix("torch."),
                rows=len(batches[1]),
                tokens=int(batches[1].attention_mask.sum()),
                computed_tokens=work["tokens"],
                shared_prompt_forward=learner.policy.prefix_tree,
                timed_steps=len(times),
                step_s=step_s,
                step_s_each=times,  # each batch has its own lengths: a spread here is a per-shape cost
                dense_tree_max_tokens=ctx.dense_tree_max_tokens,
                tokens_per_s=statistics.median(tokens_per_s),
                model_tflops_per_step=work["flops"] / 1e12,
                mfu=work["flops"] / step_s / ctx.peak_flops if ctx.peak_flops else None,
                peak_memory_gib=peak_gib(ctx.device),
                loss_finite=math.isfinite(out["loss"]) and math.isfinite(out["grad_norm"]),
                timing={k: v for k, v in out.items() if k.startswith("timing/")},  # the last timed step's
            )
            part.checks["loss_and_grad_norm_finite"] = r["loss_finite"]
            # Where the step goes (one more step, profiled): the MFU gap is either the device idle
            # (host-bound) or the device busy on something other than the model's matmuls.
            prof = r["profile"] = profile_step(lambda: learner.train_step(batches[1]), ctx.device)
            kinds = ", ".join(
                f"{k} {100 * v / prof['busy_s']:.0f}%" for k, v in list(prof["by_kind_s"].items())[:4]
            )
            mfu = f"MFU {100 * r['mfu']:.1f}%" if r["mfu"] is not None else "MFU n/a"
            part.summary = (
                f"{r['params_b'] * 1e3:,.0f}M params, {r['rows']} rows x {s.prompt}+<={s.response} tokens: "
                f"step {step_s:.2f} s, {r['tokens_per_s']:,.0f} tokens/s, {mfu}, peak {r['peak_memory_gib']:.1f} GiB; "
                f"profiled step: device busy {100 * (prof['busy_frac'] or 0):.0f}% ({kinds})"
            )
        finally:
            learner.close()

    return run


def packed(batch):
    """The batch's token trees (make_batch's groups share a prompt, so there always are some)."""
    from tgc_rl.learner.prefix_tree import pack_trees

    trees = pack_trees(batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask)
    assert trees is not None, "make_batch's groups share a prompt"
    return trees


def _policy_pass(policy, batch, coef: torch.Tensor, device: torch.device):
    """Log-probs, entropies and parameter gradients of one forward/backward (the tests' equality loss)."""
    policy.lm.zero_grad(set_to_none=True)
    lp, ent = policy(
        batch.input_ids.to(device),
        batch.attention_mask.to(device),
        batch.prompt_len,
        batch.response_mask.to(device),
    )
    ((lp * coef).sum() + 0.1 * (ent * batch.response_mask.to(device)).sum()).backward()
    return (
        lp.detach(),
        ent.detach(),
        {n: p.grad for n, p in policy.lm.named_parameters() if p.grad is not None},
    )


def speed_model(ctx: Context):
    """The whole 0.5B model in the device's compute dtype (bf16 on a GPU): what the speed comparisons time."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path(ctx, "0.5b"), dtype=compute_dtype(ctx.device)).to(
        ctx.device
    )


def _alternating_passes(
    policies: dict[str, Any],
    inputs: list[tuple[Any, torch.Tensor]],
    device: torch.device,
    passes: int,
    stop: Callable[[], bool] = lambda: False,
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """One untimed pass of each policy, then up to `passes` rounds of one timed pass each, alternating so that
    load from elsewhere hits all alike (`stop` ends early after two timed rounds): times and peak GiB by policy.
    Round i runs inputs[i % len(inputs)] (batch, coefficients): several batches give every round new lengths."""
    times: dict[str, list[float]] = {k: [] for k in policies}
    peaks: dict[str, float] = {}
    for i in range(passes + 1):
        batch, coef = inputs[i % len(inputs)]
        for k, p in policies.items():
            reset_peak(device)
            dt = timed(functools.partial(_policy_pass, p, batch, coef, device), device)
            p.lm.zero_grad(set_to_none=True)
            if i:
                times[k].append(dt)
            peaks[k] = max(peaks.get(k, 0.0), peak_gib(device))
        if i >= 2 and stop():
            break
    return times, peaks


def part_shared_prompt(ctx: Context, part: Part) -> None:
    """Equality in float32 on a shallow model of the 0.5B shape (gradients need no depth to differ), speed in
    bf16 on the whole 0.5B model: one forward/backward per row vs one token tree per group."""
    from tgc_rl.learner.logprobs import PolicyLogprobs

    s, dev = ctx.sizes, ctx.device
    batch = make_batch(s.tree_groups, s.tree_group, s.tree_prompt, s.tree_response, s.vocab, seed=7, common=8)
    coef = torch.randn(batch.response_mask.shape, generator=torch.Generator().manual_seed(0)).to(dev)
    coef = coef * batch.response_mask.to(dev)
    shapes = TINY_SHAPES if ctx.tiny else SHAPES
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 means float32
    try:
        lm = random_lm(
            qwen2_config(shapes["0.5b"], s.vocab, layers=s.tree_eq_layers), dev, torch.float32, seed=1
        )
        full = _policy_pass(PolicyLogprobs(lm, s.chunk_tokens), batch, coef, dev)
        tree_policy = PolicyLogprobs(lm, s.chunk_tokens, prefix_tree=True)
        tree = _policy_pass(tree_policy, batch, coef, dev)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    r = part.results
    r["tree_nodes"], r["full_tokens"] = tree_policy.last_nodes, int(batch.attention_mask.sum())
    r["logprob_max_abs_err"] = float((tree[0] - full[0]).abs().max())
    r["entropy_max_abs_err"] = float((tree[1] - full[1]).abs().max())
    r["grad_max_rel_err"] = max(max_rel_err(tree[2][n], g) for n, g in full[2].items())
    r["grad_tensors"] = len(full[2])
    part.checks["tree_forward_ran"] = tree_policy.last_nodes < r["full_tokens"]
    part.checks["same_parameters_get_gradients"] = full[2].keys() == tree[2].keys()
    part.checks["logprobs_equal"] = r["logprob_max_abs_err"] <= 1e-4
    part.checks["entropies_equal"] = r["entropy_max_abs_err"] <= 1e-4
    part.checks["gradients_equal"] = (
        r["grad_max_rel_err"] <= 1e-4
    )  # float32 rounding, relative to each tensor
    del lm, full, tree, tree_policy
    free(dev)

    # Speed: the whole model in bf16, one untimed pass each, then alternating timed passes.
    lm = speed_model(ctx)
    policies = {
        "full": PolicyLogprobs(lm, s.chunk_tokens),
        "tree": PolicyLogprobs(lm, s.chunk_tokens, prefix_tree=True),
    }
    t0 = time.perf_counter()
    times, peaks = _alternating_passes(policies, [(batch, coef)], dev, s.steps, lambda: part.over_budget(t0))
    full_s, tree_s = statistics.median(times["full"]), statistics.median(times["tree"])
    r.update(
        speed_dtype=str(compute_dtype(dev)).removeprefix("torch."),
        full_s=full_s,
        tree_s=tree_s,
        speedup=full_s / tree_s,
        full_peak_gib=peaks["full"],
        tree_peak_gib=peaks["tree"],
    )
    part.summary = (
        f"prompt {s.tree_prompt} / response <={s.tree_response} x {s.tree_group}: grads max rel err "
        f"{r['grad_max_rel_err']:.1e}; fwd+bwd {full_s:.3f} s full vs {tree_s:.3f} s tree = {r['speedup']:.2f}x "
        f"({r['full_tokens']} vs {r['tree_nodes']} tokens), peak {peaks['full']:.1f} vs {peaks['tree']:.1f} GiB"
    )


def part_tree_threshold(ctx: Context, part: Part) -> None:
    """Forward + backward of the shared-prompt pass with the dense tree mask and with the tree kernel, alternating,
    at growing tree sizes (the whole 0.5B model in the compute dtype): the measured crossover is where
    `optim.dense_tree_max_tokens` belongs on this device."""
    from tgc_rl.learner.logprobs import PolicyLogprobs

    s, dev = ctx.sizes, ctx.device
    lm = speed_model(ctx)
    policies = {
        "dense": PolicyLogprobs(lm, s.chunk_tokens, prefix_tree=True, dense_tree_max_tokens=2**20),
        "kernel": PolicyLogprobs(lm, s.chunk_tokens, prefix_tree=True, dense_tree_max_tokens=0),
    }
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, response in enumerate(s.threshold_responses):
        # Every timed pass gets a batch of new lengths, as every trainer step does: a path whose cost depends on
        # having seen the shape before (cuDNN attention builds a plan per shape) pays it here as in training.
        # The first batch warms both paths (the kernel's first pass compiles on CUDA) and is not timed.
        batches = [
            make_batch(1, s.group_size, s.threshold_prompt, response, s.vocab, seed=11 + 10 * i + k, common=4)
            for k in range(4)
        ]
        inputs = [(b, b.response_mask.to(dev).float()) for b in batches]
        times, _ = _alternating_passes(policies, inputs, dev, len(batches) - 1)
        dense_s, kernel_s = statistics.median(times["dense"]), statistics.median(times["kernel"])
        nodes = int(statistics.median(packed(b).nodes for b in batches[1:]))
        rows.append({"nodes": nodes, "dense_s": dense_s, "kernel_s": kernel_s, "ratio": dense_s / kernel_s})
        part.checks[f"kernel_path_ran_{nodes}"] = policies["kernel"].last_tree_attention in ("block", "flex")
        if part.over_budget(t0):
            break
    r = part.results
    r["kernel"] = policies["kernel"].last_tree_attention
    r["points"] = rows
    # the smallest measured tree from which the kernel is at least as fast at every larger one too
    ratios = [x["ratio"] for x in rows]
    wins_from = next((x["nodes"] for j, x in enumerate(rows) if min(ratios[j:]) >= 1.0), None)
    r["kernel_wins_from_nodes"] = wins_from
    part.summary = (
        f"{r['kernel']} vs dense, dense/kernel time: "
        + ", ".join(f"{x['nodes']} nodes {x['ratio']:.2f}x" for x in rows)
        + (
            f"; the kernel wins from {wins_from} nodes"
            if wins_from
            else "; the dense mask wins at the largest tree"
        )
    )
    del lm, policies
    free(dev)


# FlexAttention backward variants on one tree: the production call first, then what might make its backward
# faster (the profile of 2026-11-28 had it at 7.6x its forward). Block sizes go in as kernel_options ("bwd_"
# keys reach the backward only); 64 x 64 divides the 128-token sparse blocks.
BWD_64X64 = {
    "bwd_BLOCK_M1": 64,
    "bwd_BLOCK_N1": 64,
    "bwd_BLOCK_M2": 64,
    "bwd_BLOCK_N2": 64,
    "bwd_num_warps": 4,
}
# name: (K/V expanded to every query head, kernel_options)
FLEX_VARIANTS: dict[str, tuple[bool, Any]] = {
    "gqa": (False, None),
    "expanded_kv": (True, None),
    "gqa_bwd_64x64": (False, BWD_64X64),
    "expanded_kv_bwd_64x64": (True, BWD_64X64),
}


def part_flex_backward(ctx: Context, part: Part) -> None:
    """FlexAttention on one tree of the learner's shape (the 0.5B heads, 14 query over 2 KV heads, head dim 64;
    one group of `group_size` responses, as one micro-batch), compiled as the learner compiles it, by variant
    (FLEX_VARIANTS): outputs and gradients against the production call, forward and forward + backward times.
    A CPU has no FlexAttention backward, so there the variants run eager, forward only."""
    from torch.nn.attention.flex_attention import flex_attention

    from tgc_rl.learner.tree_attention import tree_block_mask, tree_ends_mask

    s, dev = ctx.sizes, ctx.device
    cuda = dev.type == "cuda"
    hidden, _, _, hq, hkv = (TINY_SHAPES if ctx.tiny else SHAPES)["0.5b"]
    batch = make_batch(1, s.group_size, s.prompt, s.response, s.vocab, seed=21)
    ends_mask = tree_ends_mask(packed(batch).subtree_end).to(dev)
    L, d = ends_mask.shape[-1], hidden // hq
    block_mask = tree_block_mask(ends_mask)
    flex = torch.compile(flex_attention, dynamic=True) if cuda else flex_attention
    gen = torch.Generator().manual_seed(5)
    dtype = compute_dtype(dev)
    q0 = torch.randn(1, hq, L, d, generator=gen).to(dev, dtype)
    k0, v0 = (torch.randn(1, hkv, L, d, generator=gen).to(dev, dtype) for _ in range(2))
    grad_out = torch.randn(1, hq, L, d, generator=gen).to(dev, dtype)
    scale = d**-0.5

    def run(expand: bool, options: Any, backward: bool):
        q, k, v = (x.detach().requires_grad_(backward) for x in (q0, k0, v0))
        kk, vv = (x.repeat_interleave(hq // hkv, dim=1) for x in (k, v)) if expand else (k, v)
        out = flex(
            q, kk, vv, block_mask=block_mask, scale=scale, enable_gqa=not expand, kernel_options=options
        )
        if backward:
            out.backward(grad_out)
            return out.detach(), (q.grad, k.grad, v.grad)
        return out.detach(), ()

    rows: dict[str, dict[str, Any]] = {}
    ref: tuple[torch.Tensor, tuple] | None = None
    t0 = time.perf_counter()
    for name, (expand, options) in FLEX_VARIANTS.items():
        try:
            out, grads = run(expand, options, cuda)  # compiles on first use
            if ref is None:
                ref = (out, grads)
            errs = [
                max_rel_err(a.float(), b.float())
                for a, b in zip((out, *grads), (ref[0], *ref[1]), strict=True)
            ]
            fwd = statistics.median(
                timed(functools.partial(run, expand, options, False), dev) for _ in range(5)
            )
            both = (
                statistics.median(timed(functools.partial(run, expand, options, True), dev) for _ in range(5))
                if cuda
                else None
            )
            rows[name] = {"max_rel_err": max(errs), "fwd_s": fwd, "fwd_bwd_s": both}
            # bf16 against the production call: a different summation order is ~1e-2, a wrong mask ~1
            part.checks[f"{name}_equals_the_production_call"] = max(errs) < 5e-2
        except Exception as e:  # a variant that does not compile here is a finding, not the part's failure
            if name == "gqa":
                raise
            rows[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        if part.over_budget(t0):
            break
    r = part.results
    r.update(tree_nodes=L, heads=hq, kv_heads=hkv, head_dim=d, backward=cuda, variants=rows)
    base = rows["gqa"]["fwd_bwd_s" if cuda else "fwd_s"]

    def say(name: str, row: dict[str, Any]) -> str:
        if "error" in row:
            return f"{name} error"
        if not cuda:
            return f"{name} fwd {row['fwd_s'] * 1e3:.1f} ms"
        bwd_ratio = (row["fwd_bwd_s"] - row["fwd_s"]) / row["fwd_s"]
        return f"{name} {base / row['fwd_bwd_s']:.2f}x (bwd/fwd {bwd_ratio:.1f})"

    head = "fwd+bwd speed vs gqa" if cuda else "eager forward only (no CPU backward)"
    part.summary = f"{L} nodes, {head}: " + ", ".join(say(n, row) for n, row in rows.items())
    free(dev)


def part_chunked_logprobs(ctx: Context, part: Part) -> None:
    """The chunked head against whole logits at vocab 151936 (float32): values, gradients, peak memory."""
    import torch.nn.functional as F

    from tgc_rl.learner.logprobs import chunked_head_logprobs

    s, dev = ctx.sizes, ctx.device
    hidden_size = (TINY_SHAPES if ctx.tiny else SHAPES)["0.5b"][0]  # SHAPE_FIELDS[0]
    gen = torch.Generator().manual_seed(3)
    h0 = torch.randn(s.head_tokens, hidden_size, generator=gen).to(dev)
    w0 = (torch.randn(VOCAB, hidden_size, generator=gen) * hidden_size**-0.5).to(dev)
    targets = torch.randint(0, VOCAB, (s.head_tokens,), generator=gen).to(dev)
    coef = torch.randn(s.head_tokens, generator=gen).to(dev)

    def whole(h, w):
        logp = F.log_softmax(h @ w.T, -1)
        return logp.gather(-1, targets[:, None]).squeeze(-1), -(logp.exp() * logp).sum(-1)

    def chunked(h, w):
        return chunked_head_logprobs(h, w, None, targets, s.chunk_tokens)

    out = {}
    for name, fn in (("whole", whole), ("chunked", chunked)):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        free(dev)
        reset_peak(dev)
        base = torch.cuda.memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0

        def step(h=h, w=w, fn=fn, name=name):
            lp, ent = fn(h, w)
            ((lp * coef).sum() + ent.sum()).backward()
            out[name] = (lp.detach(), ent.detach(), h.grad, w.grad)

        seconds = timed(step, dev)
        part.results[f"{name}_s"] = seconds
        part.results[f"{name}_peak_gib"] = peak_gib(dev) - base if dev.type == "cuda" else None
    errs = {
        key: max_rel_err(out["chunked"][i], out["whole"][i])
        for i, key in enumerate(("logprob", "entropy", "grad_hidden", "grad_weight"))
    }
    part.results.update({f"{k}_max_rel_err": v for k, v in errs.items()}, tokens=s.head_tokens, vocab=VOCAB)
    for k, v in errs.items():
        part.checks[f"{k}_equal"] = v <= 1e-4
    mem = part.results["chunked_peak_gib"]
    part.summary = (
        f"{s.head_tokens} tokens x vocab {VOCAB}, chunks of {s.chunk_tokens}: max rel err "
        f"{max(errs.values()):.1e}"
        + (
            f"; peak {mem:.2f} GiB chunked vs {part.results['whole_peak_gib']:.2f} GiB whole"
            if mem is not None
            else ""
        )
    )


def rl_inputs(s: Sizes) -> dict[str, torch.Tensor]:
    """Log-probs whose ratios to the old ones lie on a grid of exp(k/64), |k| <= 8 (0.88..1.13): no ratio sits
    within float rounding of a clip bound (0.8, 1.2, 1.28, +-0.4 in log space), so no gate decision can flip
    between devices; ragged response lengths, alternating rewards, group ids of the trainer's layout."""
    gen = torch.Generator().manual_seed(5)
    B, T = s.rl_groups * s.rl_group_size, s.rl_tokens
    lengths = torch.randint(max(T // 2, 1), T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    old = -torch.rand(B, T, generator=gen) * 4
    lp = old + torch.randint(-8, 9, (B, T), generator=gen) / 64
    ids = torch.randint(3, 50, (B, T), generator=gen)
    ids[:, :3] = ids[:: s.rl_group_size, :3].repeat_interleave(s.rl_group_size, 0)  # group-common prefixes
    return {
        "lp": lp * mask,
        "old": old * mask,
        "ref": (old - 0.01) * mask,
        "ent": torch.rand(B, T, generator=gen) * 2 * mask,
        "mask": mask,
        "ids": ids * mask.long(),
        "gids": torch.arange(s.rl_groups).repeat_interleave(s.rl_group_size),
        "rewards": (torch.arange(B) % 2).float(),
    }


def rl_run(objective: str, data: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype, G: int):
    """One objective's loss, token weights (-dloss/dlp) and diagnostics, as the learner computes them."""
    import rlcore

    d = {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) for k, v in data.items()}
    obj = rlcore.get_objective(objective)
    adv = obj.advantages(d["rewards"], d["gids"], d["mask"])
    lp = d["lp"].clone().requires_grad_()
    ent = d["ent"].clone().requires_grad_()
    out = obj.loss(lp, d["old"], adv, d["mask"], d["gids"], d["ref"], entropies=ent)
    g_lp, g_ent = torch.autograd.grad(out.loss, [lp, ent], allow_unused=True)
    w = -g_lp
    diag = rlcore.cancellation_diagnostics(
        w.detach(),
        d["ids"],
        d["mask"],
        d["gids"],
        adv,
        old_logprobs=d["old"],
        entropies=d["ent"],
        clipped=out.clipped,
        group_size=G,
    )
    scalars = {"loss": float(out.loss.detach())}
    scalars.update({f"objective/{k}": float(v) for k, v in out.metrics.items()})
    scalars.update({k: float(v) for k, v in diag.items()})  # keys already diag/...
    grads = {"weights": w.detach(), **({"entropy_grad": g_ent.detach()} if g_ent is not None else {})}
    return scalars, grads


def part_rlcore(ctx: Context, part: Part) -> None:
    """Each preset on the device in float32 against the CPU (float32 on a GPU run; float64 on the CPU run,
    where the same device would compare a computation with itself)."""
    import rlcore

    s, dev = ctx.sizes, ctx.device
    data = rl_inputs(s)
    dtype = torch.float32 if dev.type == "cuda" else torch.float64
    worst: dict[str, float] = {}
    for name in rlcore.list_objectives():
        want_s, want_g = rl_run(name, data, torch.device("cpu"), torch.float32, s.rl_group_size)
        got_s, got_g = rl_run(name, data, dev, dtype, s.rl_group_size)
        part.checks[f"{name}_same_keys"] = want_s.keys() == got_s.keys() and want_g.keys() == got_g.keys()
        scalar_err = max(
            (
                abs(got_s[k] - v) / (abs(v) + 0.01)  # relative, absolute below 0.01: residuals are ~0
                for k, v in want_s.items()
                if k in got_s and math.isfinite(v)
            ),
            default=0.0,
        )
        nonfinite = [
            k for k, v in want_s.items() if k in got_s and math.isfinite(v) != math.isfinite(got_s[k])
        ]
        grad_err = max((max_rel_err(got_g[k], v) for k, v in want_g.items() if k in got_g), default=0.0)
        worst[name] = max(scalar_err, grad_err)
        # scalars 1e-3: correlations of a nearly constant kappa (d3_corr_*) carry float32 rounding to ~1e-4
        part.checks[f"{name}_equal"] = scalar_err <= 1e-3 and grad_err <= 1e-4 and not nonfinite
    part.results.update(
        objectives=len(worst),
        reference="cpu/float32",
        candidate=f"{dev.type}/{str(dtype).removeprefix('torch.')}",
        rows=s.rl_groups * s.rl_group_size,
        tokens=s.rl_tokens,
        max_rel_err=worst,
    )
    part.summary = (
        f"{len(worst)} objectives, loss + metrics + token weights + diagnostics, {part.results['candidate']} vs "
        f"cpu/float32: worst rel err {max(worst.values()):.1e} ({max(worst, key=worst.__getitem__)})"
    )


def part_rollout_hf(ctx: Context, part: Part) -> None:
    from tgc_rl.config import ModelSpec, SamplingSpec
    from tgc_rl.rollout.hf_engine import HFEngine
    from tgc_rl.rollout.spec import RolloutSpec

    s = ctx.sizes
    path = model_path(ctx, "0.5b")
    # float32: the engine decodes on the CPU, where bf16 is emulated unless the CPU has AVX512-BF16/AMX
    spec = RolloutSpec(
        model=ModelSpec(source=str(path), dtype="float32", chat_template=False),
        sampling=SamplingSpec(max_new_tokens=s.gen_tokens, temperature=1.0),
        seed=0,
        engine="hf",
        broadcast=False,
        gpus=0.0,
        memory_fraction=0.1,
    )
    engine = HFEngine(spec, path)
    try:
        gen = torch.Generator().manual_seed(11)
        prompts = [
            torch.randint(3, s.vocab, (64 if not ctx.tiny else 8,), generator=gen).tolist()
            for _ in range(s.gen_prompts)
        ]
        engine.generate(prompts[:1], 1, [0])  # warm-up
        t0 = time.perf_counter()
        out = engine.generate(prompts, s.gen_samples, list(range(len(prompts))))
        seconds = time.perf_counter() - t0
        engine_device = str(next(engine.model.parameters()).device)
    finally:
        engine.close()
    tokens = sum(len(c.token_ids) for group in out for c in group)
    part.results.update(
        engine_device=engine_device,
        sequences=s.gen_prompts * s.gen_samples,
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds,
    )
    part.checks["every_sample_returned"] = sum(len(g) for g in out) == s.gen_prompts * s.gen_samples
    part.summary = (
        f"{tokens} tokens in {seconds:.2f} s = {tokens / seconds:,.0f} tokens/s "
        f"({part.results['sequences']} sequences, float32 on the CPU: the engine has no device option)"
    )


def e2e_spec(path: Path, tiny: bool) -> dict[str, Any]:
    """A two-step job on one GPU: vLLM replica and learner share it, weights go by NCCL broadcast."""
    return {
        "name": "gpu-check",
        "model": {"source": str(path), "dtype": "bfloat16", "chat_template": False},
        "task": {"name": "arithmetic", "reward_workers": 1},
        "objective": {"name": "cp_grpo"},
        "group_size": 4,
        "prompts_per_step": 2 if tiny else 8,
        "steps": 2,
        "seed": 0,
        "sampling": {"max_new_tokens": 8 if tiny else 128, "max_prompt_tokens": 128},
        "optim": {"lr": 1e-6, "micro_batch_size": 8},
        "resources": {
            "rollout_engine": "vllm",
            "weight_sync": "broadcast",
            "gpus_per_learner": 0.5,
            "gpus_per_rollout": 0.5,
            "vllm_memory_fraction": 0.3,
            "cpus_per_learner": 1,
            "cpus_per_rollout": 1,
        },
        "checkpoint": {"every_steps": 100},
    }


def part_e2e_broadcast(ctx: Context, part: Part) -> None:
    if ctx.device.type != "cuda":
        raise _Skip("the NCCL weight broadcast needs a CUDA device")
    from tgc_rl.config import JobSpec
    from tgc_rl.trainer.main import run

    run_dir = ctx.work / "e2e"
    spec = JobSpec.parse(e2e_spec(model_path(ctx, "0.5b"), ctx.tiny))
    t0 = time.perf_counter()
    state = run(spec, run_dir)
    seconds = time.perf_counter() - t0
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln]
    broadcast = [r.get("sync/broadcast") for r in rows]
    part.results.update(
        state=state,
        seconds=seconds,
        sync_broadcast=broadcast,
        sync_s=[r.get("timing/sync_s") for r in rows],
        step_s=[r.get("timing/step_s") for r in rows],
    )
    part.checks["job_succeeded"] = state == "succeeded"
    part.checks["second_step_broadcast"] = broadcast == [0.0, 1.0]  # the first sync opens the group
    part.summary = f"{state} in {seconds:.0f} s, sync/broadcast {broadcast}, sync s {part.results['sync_s']}"


class _Skip(Exception):
    """A part that does not apply here (not a failure)."""


# Each part: its function and the modules it imports (a missing one skips the part, named in the report).
PARTS: dict[str, tuple[Callable[[Context, Part], None], tuple[str, ...]]] = {
    "device": (part_device, ()),
    "matmul_peak": (part_matmul_peak, ("tgc_rl.learner.sharding",)),
    "learner_0.5b": (
        part_learner("0.5b"),
        ("tgc_rl.learner.learner", "rlcore.diagnostics", "learner_flops"),
    ),
    "learner_1.5b": (
        part_learner("1.5b"),
        ("tgc_rl.learner.learner", "rlcore.diagnostics", "learner_flops"),
    ),
    "shared_prompt": (part_shared_prompt, ("tgc_rl.learner.logprobs", "rlcore.objective")),
    "tree_threshold": (part_tree_threshold, ("tgc_rl.learner.logprobs",)),
    "flex_backward": (part_flex_backward, ("tgc_rl.learner.tree_attention", "tgc_rl.learner.prefix_tree")),
    "chunked_logprobs": (part_chunked_logprobs, ("tgc_rl.learner.logprobs",)),
    "rlcore": (part_rlcore, ("rlcore.objective", "rlcore.diagnostics")),
    "rollout_hf": (part_rollout_hf, ("tgc_rl.rollout.hf_engine",)),
    "e2e_broadcast": (part_e2e_broadcast, ("vllm", "ray", "tgc_rl.trainer.main")),
}


def missing_import(modules: tuple[str, ...]) -> str | None:
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # ImportError (absent) or anything a half-installed package raises
            return f"{m} does not import: {type(e).__name__}: {e}"
    return None


def run_part(ctx: Context, name: str) -> Part:
    fn, needs = PARTS[name]
    part = Part(name, BUDGETS[name])
    reason = missing_import(needs)
    if reason:
        part.reason = reason
        return part
    t0 = time.perf_counter()
    try:
        fn(ctx, part)
        failed = [k for k, ok in part.checks.items() if not ok]
        part.status = "failed" if failed else "ok"
        part.reason = f"checks failed: {', '.join(failed)}" if failed else ""
    except _Skip as e:
        part.status, part.reason = "skipped", str(e)
    except Exception as e:  # one part's failure (an OOM, a kernel error) must not stop the others
        part.status, part.reason = "failed", f"{type(e).__name__}: {e}"
        part.results["traceback"] = traceback.format_exc()[-4000:]
    finally:
        part.seconds = time.perf_counter() - t0
        free(ctx.device)
    return part


# -- report ----------------------------------------------------------------------------------------------


def default_out(device_name: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "device"
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M")
    return ROOT / "benchmarks" / "gpu" / f"{slug}-{stamp}.json"


def text_report(report: dict[str, Any]) -> str:
    lines = [
        f"tgc-rl GPU check, {report['date']}, device {report['device']}"
        + (" (tiny shapes)" if report["tiny"] else ""),
    ]
    for p in report["parts"]:
        head = f"{p['name']:<17} {p['status']:<8} {p['seconds']:6.1f} s / {p['budget_s']:.0f} s"
        body = p["summary"] if p["status"] == "ok" else p["reason"]
        if p["status"] == "failed" and p["summary"]:
            body = f"{p['reason']} | {p['summary']}"
        lines.append(f"{head}  {body}")
    lines.append(
        f"total {report['seconds']:.0f} s; {report['verdict']}"
        + (f" (skipped: {', '.join(report['skipped'])})" if report["skipped"] else "")
    )
    return "\n".join(lines) + "\n"


def int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU variant the test suite runs)")
    ap.add_argument("--out", type=Path, help="report path (.json; the text report beside it as .txt)")
    ap.add_argument("--parts", help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    ap.add_argument("--work", type=Path, help="where the random models go (default: a temporary folder)")
    ap.add_argument(
        "--time-limit",
        type=float,
        default=480,
        help="seconds; parts not started by then are skipped (default 480)",
    )
    ap.add_argument(
        "--dense-tree-max-tokens",
        type=int,
        help="the learner parts' optim.dense_tree_max_tokens (default: by device; 0: the tree kernel for every tree)",
    )
    for f in dataclasses.fields(Sizes):
        ap.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=int_list if isinstance(f.default, tuple) else int,
            help=f"default {f.default}, tiny {getattr(TINY, f.name)}"
            + (" (comma-separated)" * isinstance(f.default, tuple)),
        )
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA device visible; run with --device cpu --tiny for the CPU variant",
            file=sys.stderr,
        )
        return 2
    base = TINY if args.tiny else Sizes()
    sizes = dataclasses.replace(
        base, **{f.name: getattr(args, f.name) for f in dataclasses.fields(Sizes) if getattr(args, f.name)}
    )
    names = args.parts.split(",") if args.parts else list(PARTS)
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        print(f"gpu-check: unknown part(s) {unknown}; choose from {list(PARTS)}", file=sys.stderr)
        return 2
    if "device" not in names:
        names.insert(0, "device")
    if any(n.startswith("learner_") for n in names) and "matmul_peak" not in names:
        names.insert(1, "matmul_peak")  # MFU's denominator

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tgc-gpu-check-", dir=args.work) as work:
        ctx = Context(device, sizes, args.tiny, Path(work), dense_tree_max_tokens=args.dense_tree_max_tokens)
        parts = []
        for name in names:
            if time.perf_counter() - t0 > args.time_limit:
                part = Part(
                    name,
                    BUDGETS[name],
                    reason=f"not started: the run passed --time-limit {args.time_limit:g} s",
                )
            else:
                part = run_part(ctx, name)
            parts.append(part)
            print(f"gpu-check: {name}: {part.status} {part.summary or part.reason}", flush=True)
    device_name = parts[0].results.get("name", args.device)
    failed = [p.name for p in parts if p.status == "failed"]
    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": device_name,
        "tiny": args.tiny,
        "sizes": dataclasses.asdict(sizes),
        "seconds": time.perf_counter() - t0,
        "verdict": f"FAILED: {', '.join(failed)}" if failed else "PASS: every check held",
        "failed": failed,
        "skipped": [p.name for p in parts if p.status == "skipped"],
        "parts": [dataclasses.asdict(p) for p in parts],
    }
    out = args.out or default_out(device_name if device.type == "cuda" else "cpu")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    text = text_report(report)
    out.with_suffix(".txt").write_text(text)
    print(text, end="")
    print(f"gpu-check: wrote {out.with_suffix('.json')} and {out.with_suffix('.txt')}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
