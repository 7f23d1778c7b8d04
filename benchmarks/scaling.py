"""Learner scaling with response length and group size: tgc-rl vs TRL's GRPOTrainer vs the plain loop (issue 33,
item 1), each point in a fresh process, one JSON a point under benchmarks/results/scaling/.

A point is one batch of `prompts` x `group` responses of R tokens (prompt P tokens; the responses are distinct
from their first token, so that only the prompt is shared), built without generation, and the same batch for
three systems:

  tgc    tgc_rl.learner.Learner (FSDP2, world size 1), the shared-prompt forward with its automatic tree kernel
         choice (`optim.dense_tree_max_tokens` null: dense mask up to 1024 nodes on a CPU, the block kernel
         beyond); the decoder computes P + group x R tokens a group
  plain  the plain torch loop (benchmarks/learner.py's `plain_loop_step`): the HF model unwrapped, one forward
         per row (group x (P + R) tokens), the same chunked head and rlcore loss, AdamW
  trl    TRL's GRPOTrainer doing its real training step on that batch (`training_step`: its model forward over
         prompt + completion of every row, its loss, backward, then the Trainer's clip and optimizer step),
         generation bypassed: `_generate` returns the batch's prompt and completion ids. beta 0 and one
         iteration (gradient_accumulation_steps 1), so TRL computes no reference and no old-policy forward:
         its only forward is the policy's, with whole logits over the completion (no chunking)

All three: dr_grpo (TRL `loss_type="dr_grpo"`, `scale_rewards="none"`, epsilon 0.2: the same per-token
gradients, benchmarks/trl_loss_parity.py), rewards alternating 0/1 within each group, the loss on every
response token, one micro-batch of all rows, activation checkpointing (TRL's default), AdamW lr 1e-6, float32,
2 torch threads. The model is a random Llama (SHAPE below) whose head is ~0.3 of its linear weights, as in
Qwen2.5-0.5B or SmolLM2-135M; a 152k vocabulary on a model this small would make every point the head's.

Each point: `--warmup` untimed steps, then `--steps` timed ones; step time = their median, tokens/s = response
tokens / step time, peak RSS = the kernel's high-water mark over all steps (VmHWM, reset when the model,
optimizer and batch are built; base = RSS then). The parent kills a child above `--cap-gb` (a shared
machine): such a point is stored as "> cap" and not retried.

    flock /tmp/tgc-heavy.lock true; .venv/bin/python benchmarks/scaling.py --lock /tmp/tgc-heavy.lock
    .venv/bin/python benchmarks/scaling.py --report          # table, bounds and PNG from the stored points
    .venv/bin/python benchmarks/scaling.py --only 1 --systems tgc plain --lock /tmp/tgc-heavy.lock
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fcntl
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from tgc_rl.config import cpu_model  # noqa: E402  (after the repo root is on the path)

RESULTS = ROOT / "benchmarks" / "results" / "scaling"

SYSTEMS = ("tgc", "plain", "trl")
SHAPE = {  # a small Llama; head (vocab x hidden = 4.2M) ~0.3 of the linear weights (4 x 2.8M + 4.2M)
    "num_hidden_layers": 4,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 8192,
}
CHUNK = 1024  # tgc's and the plain loop's log-prob chunk (tokens)
LR = 1e-6
TARGET = 0.5  # tgc step time / TRL's at response 1024


@dataclass(frozen=True)
class Shape:
    prompt: int
    response: int
    group: int
    prompts: int = 1
    priority: int = 1  # the brief's order: 1 is measured first

    @property
    def rows(self) -> int:
        return self.prompts * self.group

    @property
    def response_tokens(self) -> int:
        return self.rows * self.response

    def decoder_tokens(self, system: str) -> int:
        """Tokens the decoder computes: each group's prompt once (tgc's tree) or once per row."""
        if system == "tgc":
            return self.prompts * (self.prompt + self.group * self.response)
        return self.rows * (self.prompt + self.response)

    def key(self, system: str) -> str:
        return f"{system}-p{self.prompt}-r{self.response}-g{self.group}-n{self.prompts}"


# The brief's priority order: (1) the target, (2) short responses, (3) group 16, (4) 4096 tokens.
GRID = (
    Shape(256, 1024, 8, priority=1),
    Shape(2048, 1024, 8, priority=1),
    Shape(256, 64, 8, priority=2),
    Shape(256, 256, 8, priority=2),
    Shape(256, 1024, 16, priority=3),
    Shape(256, 4096, 8, priority=4),
)


@dataclass
class Point:
    system: str
    prompt: int
    response: int
    group: int
    prompts: int
    decoder_tokens: int
    response_tokens: int
    steps_s: list[float]  # the timed steps
    warmup_s: list[float]
    step_s: float  # median of steps_s (the first step's time when there is no timed step after a warm-up)
    timing: str  # "median of N after W warm-up" or "first step"
    tokens_per_s: float  # response tokens / step_s
    base_mb: float
    peak_mb: float
    detail: str  # tgc: the tree attention it ran; trl: what its step computed
    threads: int
    cpu: str = ""
    date: str = ""
    load: list[float] = dataclasses.field(default_factory=list)  # 1-min load average before and after


def todo(
    shapes: tuple[Shape, ...], systems: tuple[str, ...], results: Path, only: list[int] | None = None
) -> list[tuple[Shape, str]]:
    """(shape, system) pairs not yet stored under `results` (a failed point is stored too), in priority order,
    systems in the given order; `only`: these priorities."""
    out = []
    for s in sorted(shapes, key=lambda s: s.priority):
        if only and s.priority not in only:
            continue
        out += [(s, sys_) for sys_ in systems if not (results / f"{s.key(sys_)}.json").exists()]
    return out


def summarise_steps(times: list[float], warmup: int) -> tuple[float, str]:
    """Step seconds and how they were read: the median after the warm-up, else the first step."""
    timed = times[warmup:]
    if timed:
        return statistics.median(timed), f"median of {len(timed)} after {warmup} warm-up"
    return times[0], "first step"


# -- the children: one point each ------------------------------------------------------------------------


def _rss_mb(field: str = "VmRSS", pid: str = "self") -> float:
    from long_context import _rss_mb as rss

    return rss(field, pid)


def model_path() -> Path:
    """The random model's directory, built once. ModelSpec refuses a vocabulary under the tokenizer's 49152
    (sampling could emit ids the model lacks); this benchmark never samples and its ids are under
    SHAPE's vocabulary, so the spec is constructed without that check and the directory is passed on as a
    local model (which the learner, the plain loop and TRL all load as it is)."""
    from tgc_rl.config import ModelSpec
    from tgc_rl.models import model_dir

    return model_dir(ModelSpec.model_construct(source="random", dtype="float32", config_overrides=SHAPE))


def batch_tokens(shape: Shape, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Each row's prompt and response ids: `prompts` distinct prompts, each shared by its group; responses
    distinct from their first token (ids 3.. avoid the pad and special ids)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    vocab = SHAPE["vocab_size"]
    prompts, responses = [], []
    for _ in range(shape.prompts):
        p = torch.randint(3, vocab, (shape.prompt,), generator=gen).tolist()
        for i in range(shape.group):
            r = torch.randint(3, vocab, (shape.response,), generator=gen)
            r[0] = 3 + i
            prompts.append(p)
            responses.append(r.tolist())
    return prompts, responses


def rewards(shape: Shape) -> list[float]:
    return [float(i % 2) for i in range(shape.rows)]


def _train_batch(shape: Shape):
    import torch

    import rlcore
    from tgc_rl.batch import Completion, collate

    prompts, responses = batch_tokens(shape)
    comps = [Completion(r, [-1.0] * len(r), "length", 0) for r in responses]
    r = torch.tensor(rewards(shape))
    gids = [i // shape.group for i in range(shape.rows)]
    batch = collate(prompts, comps, gids, r, pad_id=2)
    return batch.with_advantages(
        rlcore.get_objective("dr_grpo").advantages(r, batch.group_ids, batch.response_mask)
    )


def _learner(shape: Shape):
    from tgc_rl.config import JobSpec
    from tgc_rl.learner import Learner, LearnerSpec

    spec = JobSpec.parse(
        {
            "name": "bench-scaling",
            "model": {"source": str(model_path()), "dtype": "float32"},
            "objective": {"name": "dr_grpo"},
            "group_size": shape.group,
            "prompts_per_step": shape.prompts,
            "steps": 10,
            "sampling": {"max_new_tokens": shape.response, "max_prompt_tokens": max(256, shape.prompt)},
            "optim": {
                "lr": LR,
                "micro_batch_size": shape.rows,
                "logprob_chunk_tokens": CHUNK,
                "activation_checkpointing": True,
            },
            "resources": {"cpus_per_learner": 1},
        }
    )
    return Learner(LearnerSpec.of(spec), model_path())


def _reset_peak() -> float:
    base = _rss_mb()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    return base


def run_local(system: str, shape: Shape, threads: int, n_steps: int) -> dict:
    """In the child: tgc's learner or the plain loop, `n_steps` steps on the same batch."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    batch = _train_batch(shape)
    if system == "plain":
        from learner import plain_loop_step
        from transformers import AutoModelForCausalLM

        import rlcore
        from tgc_rl.learner.logprobs import PolicyLogprobs

        lm = AutoModelForCausalLM.from_pretrained(model_path(), dtype=torch.float32)
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy = PolicyLogprobs(lm, CHUNK).train()
        optimizer = torch.optim.AdamW(policy.parameters(), lr=LR, fused=True)
        objective = rlcore.get_objective("dr_grpo")
        rows = [list(range(shape.rows))]

        def step():
            plain_loop_step(policy, optimizer, objective, batch, rows, shape.response, torch.float32)

    else:
        learner = _learner(shape)
        step = lambda: learner.train_step(batch)  # noqa: E731
    base = _reset_peak()
    times = []
    for _ in range(n_steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    detail = "rows" if system == "plain" else f"tree {learner.policy.last_tree_attention or 'rows'}"
    return {"times": times, "base_mb": base, "peak_mb": _rss_mb("VmHWM"), "detail": detail}


# TRL's child, run by TRL's own venv (benchmarks/vs_trl.py `ensure_trl_venv`). TRL's own `rollout_func` hook
# returns the batch's ids in place of generation; everything after it (rewards, advantages, the loss, backward,
# clip, the optimizer step) is GRPOTrainer's.
_TRL_CHILD = r"""
import json, sys, time
import torch
cfg = json.loads(open(sys.argv[1]).read())
torch.manual_seed(0)
torch.set_num_threads(cfg["threads"])
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024

fed = []
def rollout(prompts, trainer):
    # each prompt text is its group's index; TRL passes it once per completion it wants (G times a group):
    # the k-th time a group's prompt appears gets that group's k-th response
    seen = {}
    rows = []
    for p in prompts:
        k = seen[p] = seen.get(p, -1) + 1
        rows.append(cfg["rows"][int(p) * cfg["group"] + k])
    fed.append(len(rows))
    return {"prompt_ids": [r[0] for r in rows], "completion_ids": [r[1] for r in rows], "logprobs": None}

def reward(completions, **kwargs):
    return [float(i % 2) for i in range(len(completions))]

class Timer(TrainerCallback):
    def __init__(self):
        self.times, self.base = [], None
    def on_train_begin(self, args, state, control, **kw):
        self.base = status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM: the model and optimizer are built
    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self.t0)
        print(f"  TRL step {len(self.times) - 1}: {self.times[-1]:.2f} s", file=sys.stderr, flush=True)

data = Dataset.from_list([{"prompt": str(g)} for g in range(cfg["prompts"])] * cfg["n_steps"])
args = GRPOConfig(output_dir=cfg["out"], per_device_train_batch_size=cfg["prompts"] * cfg["group"],
                  gradient_accumulation_steps=1, num_generations=cfg["group"],
                  max_completion_length=cfg["response"], learning_rate=cfg["lr"], beta=0.0, loss_type="dr_grpo",
                  scale_rewards="none", epsilon=0.2, num_iterations=1, max_steps=cfg["n_steps"], logging_steps=1,
                  use_cpu=True, report_to="none", save_strategy="no", seed=0, dataloader_num_workers=0,
                  shuffle_dataset=False, gradient_checkpointing=True, bf16=False)
timer = Timer()
trainer = GRPOTrainer(model=cfg["model"], reward_funcs=reward, args=args, train_dataset=data,
                      rollout_func=rollout, callbacks=[timer])
trainer.train()
print(json.dumps({"times": timer.times, "base_mb": timer.base, "peak_mb": status("VmHWM"), "fed": fed}))
"""


def run_trl(shape: Shape, threads: int, n_steps: int, py: Path) -> list[str]:
    """The TRL child's command line (run by the parent under its RSS watch)."""
    import tempfile

    prompts, responses = batch_tokens(shape)
    cfg = {
        "model": str(model_path()),
        "rows": [[p, r] for p, r in zip(prompts, responses, strict=True)],
        "group": shape.group,
        "prompts": shape.prompts,
        "response": shape.response,
        "lr": LR,
        "threads": threads,
        "n_steps": n_steps,
        "out": tempfile.mkdtemp(prefix="scaling-trl-"),
    }
    path = Path(cfg["out"]) / "cfg.json"
    path.write_text(json.dumps(cfg))
    return [str(py), "-c", _TRL_CHILD, str(path)]


# -- the parent ------------------------------------------------------------------------------------------


def _run_capped(cmd: list[str], cap_gb: float) -> dict | str:
    """Runs a child and returns its last stdout line as JSON, or why there is none: the machine is shared, so
    a child whose resident set passes `cap_gb` is killed."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) as proc:
        killed = False
        while not killed:
            try:
                proc.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            try:
                killed = _rss_mb(pid=str(proc.pid)) > cap_gb * 1024
            except (OSError, RuntimeError):  # gone between wait and the read
                continue
            if killed:
                proc.kill()
        out = proc.communicate()[0]
    if killed:
        return f"> {cap_gb:g} GB (killed)"
    if proc.returncode:
        return f"failed (exit {proc.returncode})"
    return json.loads(out.strip().splitlines()[-1])


def measure(shape: Shape, system: str, args) -> Point | str:
    n_steps = args.warmup + args.steps
    if system == "trl":
        from vs_trl import ensure_trl_venv

        cmd = run_trl(shape, args.threads, n_steps, ensure_trl_venv())
    else:
        cmd = [sys.executable, __file__, "--child", system, json.dumps(asdict(shape))]
        cmd += ["--threads", str(args.threads), "--n-steps", str(n_steps)]
    lock = open(args.lock, "a") if args.lock else None  # noqa: SIM115 (held for the point only)
    if lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one heavy run at a time; others get the machine between points
    try:
        load = [os.getloadavg()[0]]
        got = _run_capped(cmd, args.cap_gb)
        load.append(os.getloadavg()[0])
    finally:
        if lock:
            lock.close()
    if isinstance(got, str):
        return got
    if system == "trl" and got["fed"] != [shape.rows] * n_steps:
        raise RuntimeError(
            f"TRL's rollout hook fed {got['fed']} rows in {n_steps} steps, not {shape.rows} each"
        )
    return to_point(shape, system, got, args.warmup, args.threads, load)


def to_point(shape: Shape, system: str, got: dict, warmup: int, threads: int, load: list[float]) -> Point:
    step_s, timing = summarise_steps(got["times"], warmup)
    detail = got.get("detail") or "rows; fused head over every position (CPU); no ref or old-policy forward"
    return Point(
        system=system,
        prompt=shape.prompt,
        response=shape.response,
        group=shape.group,
        prompts=shape.prompts,
        decoder_tokens=shape.decoder_tokens(system),
        response_tokens=shape.response_tokens,
        steps_s=[round(t, 2) for t in got["times"][warmup:]],
        warmup_s=[round(t, 2) for t in got["times"][:warmup]],
        step_s=round(step_s, 2),
        timing=timing,
        tokens_per_s=round(shape.response_tokens / step_s, 1),
        base_mb=round(got["base_mb"], 1),
        peak_mb=round(got["peak_mb"], 1),
        detail=detail,
        threads=threads,
        cpu=cpu_model(),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        load=[round(x, 1) for x in load],
    )


# -- the report: table, bounds, figure -------------------------------------------------------------------


def load_points(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]


def _pairs(system: str, shape: Shape) -> int:
    """Causal query-key pairs a group's attention computes: the tree's (the prompt once, each response token
    attending the prompt and its own prefix) or each row's."""
    P, R, G = shape.prompt, shape.response, shape.group
    if system == "tgc":
        return P * (P + 1) // 2 + G * (R * P + R * (R + 1) // 2)
    return G * ((P + R) * (P + R + 1) // 2)


def flops(system: str, shape: Shape) -> dict[str, float]:
    """Model FLOPs of one step by part, forward + backward (3x forward; activation checkpointing's recompute of
    the decoder not counted): the decoder's linear layers over its computed tokens, causal attention, and the
    head, whose chunked backward recomputes its logits (8VH a position). tgc and the plain loop run the head on
    response tokens only; TRL 1.16's fused head, off CUDA/XPU, projects every position of each row (prompt
    included) and masks afterwards."""
    H, L, V = SHAPE["hidden_size"], SHAPE["num_hidden_layers"], SHAPE["vocab_size"]
    kv = SHAPE["num_key_value_heads"] * (H // SHAPE["num_attention_heads"])
    linear = L * (2 * H * H + 2 * H * kv + 3 * H * SHAPE["intermediate_size"])
    head_rows = shape.rows * (shape.prompt + shape.response) if system == "trl" else shape.response_tokens
    return {
        "linear": 6.0 * linear * shape.decoder_tokens(system),
        "attention": 3.0 * 4 * H * L * _pairs(system, shape) * shape.prompts,
        "head": 8.0 * V * H * head_rows,
    }


def shape_of(p: dict) -> Shape:
    return Shape(p["prompt"], p["response"], p["group"], p["prompts"])


def rate(p: dict) -> float:
    """Achieved model GFLOP/s of a point."""
    return sum(flops(p["system"], shape_of(p)).values()) / p["step_s"] / 1e9


def curve(points: list[dict], system: str, prompt: int = 256, group: int = 8) -> list[dict]:
    """A system's points along response length at one prompt length and group size, shortest first."""
    pts = [p for p in points if p["system"] == system and p["prompt"] == prompt and p["group"] == group]
    return sorted(pts, key=lambda p: p["response"])


def name_bound(pts: list[dict]) -> str:
    """What bounds a curve (points of one system along response length), from its points and model FLOPs:
    time is compute-bound where the achieved FLOP rate holds along the curve (then the largest FLOP part
    names it), fixed-cost-bound where the shortest point runs far under the curve's best rate; memory is
    quadratic where the step's memory grows faster than its tokens (a mask), else linear."""
    if len(pts) < 2:
        return "one point: no curve"
    rates = [rate(p) for p in pts]
    longest = pts[-1]
    parts = flops(longest["system"], shape_of(longest))
    top = max(parts, key=lambda k: parts[k])
    share = parts[top] / sum(parts.values())
    out = []
    if rates[-1] >= 0.6 * max(rates):
        out.append(
            f"time: compute (time follows model FLOPs, the rate holds at {min(rates):.0f}-{max(rates):.0f} GFLOP/s; at "
            f"R={longest['response']} {top} is {share:.0%} of the FLOPs)"
        )
    else:
        out.append(
            f"time: not FLOPs (the rate falls {max(rates):.0f} -> {rates[-1]:.0f} GFLOP/s with length: memory "
            f"traffic of the {top}, {share:.0%} of the FLOPs at R={longest['response']})"
        )
    if rates[0] < 0.5 * max(rates):
        out.append(f"short responses: fixed cost ({rates[0]:.0f} GFLOP/s at R={pts[0]['response']})")
    a, b = pts[-2], pts[-1]
    grow_mem = (b["peak_mb"] - b["base_mb"]) / max(1.0, a["peak_mb"] - a["base_mb"])
    grow_tok = b["decoder_tokens"] / a["decoder_tokens"]
    per_token_kb = (b["peak_mb"] - a["peak_mb"]) * 1024 / max(1, b["decoder_tokens"] - a["decoder_tokens"])
    if grow_mem > 1.5 * grow_tok:
        out.append(
            f"memory: superlinear ({grow_mem:.1f}x for {grow_tok:.1f}x tokens: a mask or whole logits)"
        )
    else:
        out.append(f"memory: linear in computed tokens (~{per_token_kb:.0f} KB a token)")
    return "; ".join(out)


def ratio_at(points: list[dict], shape: Shape, system: str, base: str) -> float | None:
    """`system`'s step time over `base`'s at `shape`, where both were measured."""

    def find(s):
        return next(
            (p for p in points if p["system"] == s and shape_of(p) == dataclasses.replace(shape, priority=1)),
            None,
        )

    a, b = find(system), find(base)
    return a["step_s"] / b["step_s"] if a and b else None


def table(points: list[dict], missing: list[str]) -> str:
    head = (
        "| prompt | response | group | system | decoder tokens | step s | timing | response tok/s | base MB | "
        "peak MB | GFLOP/s | vs TRL | vs plain |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    order = {s: i for i, s in enumerate(SYSTEMS)}
    for p in sorted(points, key=lambda p: (p["prompt"], p["group"], p["response"], order[p["system"]])):
        sh = dataclasses.replace(shape_of(p), priority=1)
        vs = [ratio_at(points, sh, p["system"], b) for b in ("trl", "plain")]
        cells = [
            "" if v is None or p["system"] == b else f"{v:.2f}"
            for v, b in zip(vs, ("trl", "plain"), strict=True)
        ]
        lines.append(
            f"| {p['prompt']} | {p['response']} | {p['group']} | {p['system']} | {p['decoder_tokens']} | "
            f"{p['step_s']:.2f} | {p['timing']} | {p['tokens_per_s']:.0f} | {p['base_mb']:.0f} | "
            f"{p['peak_mb']:.0f} | {rate(p):.0f} | {cells[0]} | {cells[1]} |"
        )
    if missing:
        lines.append("\nNot measured: " + ", ".join(missing) + ".")
    return "\n".join(lines)


def verdict(points: list[dict]) -> list[str]:
    """The target at response 1024, group 8, per prompt length: tgc step time / TRL's <= TARGET."""
    out = []
    for prompt in (256, 2048):
        r = ratio_at(points, Shape(prompt, 1024, 8), "tgc", "trl")
        if r is None:
            out.append(f"prompt {prompt}: not measured")
        else:
            out.append(f"prompt {prompt}: {r:.2f}x TRL's step ({'met' if r <= TARGET else 'NOT met'})")
    return out


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    colours = {"tgc": "C0", "plain": "C1", "trl": "C2"}
    for system in SYSTEMS:
        for prompt, group, style in ((256, 8, "o-"), (2048, 8, "s--"), (256, 16, "^:")):
            pts = curve(points, system, prompt, group)
            if not pts:
                continue
            x = [p["response"] for p in pts]
            label = f"{system}, prompt {prompt}, group {group}"
            for ax, key in zip(axes, ("step_s", "tokens_per_s", "peak_mb"), strict=True):
                y = [p[key] / (1024 if key == "peak_mb" else 1) for p in pts]
                ax.plot(x, y, style, color=colours[system], label=label)
    for ax, label in zip(
        axes, ("step time (s)", "response tokens / s", "peak RSS of the steps (GB)"), strict=True
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("response tokens")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"One optimizer step on one micro-batch: tgc-rl Learner vs plain loop vs TRL GRPOTrainer "
        f"(random Llama, hidden {SHAPE['hidden_size']}, {SHAPE['num_hidden_layers']} layers, vocab "
        f"{SHAPE['vocab_size']}; {cpu_model()}, 2 threads)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def report(results: Path, png: Path | None) -> str:
    points = load_points(results)
    ok = [p for p in points if "step_s" in p]
    missing = [
        f"{s.key(x)} ({s and 'priority ' + str(s.priority)})" for s, x in todo(GRID, SYSTEMS, results, None)
    ]
    missing += [f"{p['key']} ({p['failed']})" for p in points if "failed" in p]
    lines = [table(ok, missing), "", "Bounds, response-length curves at prompt 256, group 8:"]
    for system in SYSTEMS:
        lines.append(f"- {system}: {name_bound(curve(ok, system))}")
    lines += ["", "Target (tgc step <= 0.5x TRL's at response 1024, group 8): " + "; ".join(verdict(ok))]
    if png:
        plot(ok, png)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    ap.add_argument("--only", type=int, nargs="+", help="measure these priorities only (1-4)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, help="timed steps after the warm-up")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cap-gb", type=float, default=8.0)
    ap.add_argument("--lock", help="hold this flock(1) file during each point (not between points)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--report", action="store_true", help="print the table and bounds of the stored points")
    ap.add_argument("--png", type=Path, default=ROOT / "benchmarks" / "scaling.png")
    ap.add_argument("--child", nargs=2, metavar=("SYSTEM", "SHAPE"), help=argparse.SUPPRESS)
    ap.add_argument("--n-steps", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        import logging

        logging.disable(logging.WARNING)
        got = run_local(args.child[0], Shape(**json.loads(args.child[1])), args.threads, args.n_steps)
        print(json.dumps(got))
        return
    if args.report:
        print(report(args.results, args.png))
        return
    print(
        f"# {cpu_model()}, {os.cpu_count()} cores, {platform.python_version()}, {args.threads} threads; "
        f"model {SHAPE}; {args.warmup} warm-up + {args.steps} timed steps a point"
    )
    args.results.mkdir(parents=True, exist_ok=True)
    for shape, system in todo(GRID, tuple(args.systems), args.results, args.only):
        t0 = time.time()
        got = measure(shape, system, args)
        path = args.results / f"{shape.key(system)}.json"
        if isinstance(got, str):
            path.write_text(json.dumps({"key": shape.key(system), "failed": got}) + "\n")
            print(f"{shape.key(system)}: {got}", flush=True)
            continue
        path.write_text(json.dumps(asdict(got), indent=1) + "\n")
        print(
            f"{shape.key(system)}: step {got.step_s:.2f} s ({got.timing}), {got.tokens_per_s:.0f} response tok/s, "
            f"peak {got.peak_mb:.0f} MB (base {got.base_mb:.0f}), {got.detail}; {time.time() - t0:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
