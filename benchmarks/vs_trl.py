"""End-to-end GRPO step time and tokens/s, tgc-rl vs TRL's GRPOTrainer, back to back on this machine.

Three configurations (`--config`), each run by both tools in one invocation, TRL first:

- `issue`: issue 17's configuration: SmolLM2-135M-Instruct (bf16 where the CPU has it), 8 arithmetic prompts
  x G=8, 16 new tokens, dr_grpo, no KL, temperature 0.7, lr 1e-6; TRL `loss_type="dr_grpo"`,
  `scale_rewards="none"` (rlcore's dr_grpo: R - mean, no std), clip 0.2.
- `default`: examples/default.yaml as it is (cp_grpo, temperature 1.0, 16 new tokens, lr 3e-5, micro-batches of
  <= 64 rows and <= 4096 computed tokens: one pass a step).
  TRL has no cp_grpo; its closest is `loss_type="dapo"` with `epsilon=0.2, epsilon_high=0.28,
  scale_rewards="group"`: the same group-std advantages, clip range and token mean over the step; it lacks
  cp_grpo's stop-gradient truncated IS weight and symmetric gate (on one on-policy pass both cost nothing).
- `long`: `issue` plus a system prompt of `--system-prompt-words` words (110: ~4x longer prompts), where
  computing each group's prompt once matters most.

tgc-rl runs a real job (local Ray, vLLM-CPU rollout, 1 FSDP2 learner rank, the reward pool, 2 CPUs); TRL runs
GRPOTrainer (transformers generate, 2 torch threads, activation checkpointing off as ours) in its own virtual
environment, created once under .cache/trl-venv (torch CPU first, then trl, so its pins cannot move this
project's). TRL trains in micro-batches of the job's `optim.micro_batch_size` rows (64 in the default job: one
generation of 64 and one forward/backward a step, as tgc-rl's token budget gives it; `--trl-micro-batch 16`: 4
accumulation steps, and no baseline check). Each tool runs `--warmup` + `--steps` steps; figures are
medians over the steps after the warm-up.

Tokens counted, the same for both tools, per step: generated = every completion's tokens up to and including
its EOS; trained = every row's prompt + completion tokens (the prompt once per row, whether or not a tool
computes it once per group). tokens/s = (generated + trained) / step time, so a tool is credited for the work
a step delivers, not for the work it happens to compute. Ratios are tgc-rl / TRL: step time (lower is
better; target <= 0.33) and tokens/s (higher is better). TRL's median step over ours is checked against
`vs_trl_<config>_speedup` in benchmarks/baselines.json (exit 1 more than 20% under it; `--update` stores it).

    flock /tmp/tgc-heavy.lock .venv/bin/python benchmarks/vs_trl.py --config issue --steps 6
    flock /tmp/tgc-heavy.lock .venv/bin/python benchmarks/vs_trl.py --config default --steps 6
    flock /tmp/tgc-heavy.lock .venv/bin/python benchmarks/vs_trl.py --config long --steps 6

(the lock keeps other heavy jobs off the machine: TRL's two OpenMP threads slow down 10x beside them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # regression_guard's baseline file and tolerance
TRL_VENV = ROOT / ".cache" / "trl-venv"
TRL_VERSION = "1.16.0"
TARGET_STEP_RATIO = 0.33


@dataclass(frozen=True)
class Config:
    objective: str  # rlcore preset of the tgc-rl job
    temperature: float
    lr: float
    trl: dict  # GRPOConfig fields that express the same objective in TRL
    system_prompt: bool = False


_DR_GRPO_TRL = {"loss_type": "dr_grpo", "scale_rewards": "none", "epsilon": 0.2}
CONFIGS = {
    "issue": Config("dr_grpo", 0.7, 1e-6, _DR_GRPO_TRL),
    "default": Config(
        "cp_grpo",
        1.0,
        3e-5,
        {"loss_type": "dapo", "scale_rewards": "group", "epsilon": 0.2, "epsilon_high": 0.28},
    ),
    "long": Config("dr_grpo", 0.7, 1e-6, _DR_GRPO_TRL, system_prompt=True),
}


@dataclass(frozen=True)
class Step:
    """One training step of either tool: its wall time and the tokens it delivered (module docstring)."""

    seconds: float
    generated: int
    trained: int

    @property
    def tokens(self) -> int:
        return self.generated + self.trained

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def summarise(steps: list[Step], warmup: int) -> dict[str, float]:
    """Medians over the steps after `warmup`: step seconds, tokens/s, tokens a step."""
    timed = steps[warmup:]
    if not timed:
        raise ValueError(f"{len(steps)} steps recorded, none after {warmup} warm-up step(s)")
    return {
        "steps": len(timed),
        "step_s": statistics.median(s.seconds for s in timed),
        "tokens_per_s": statistics.median(s.tokens_per_s for s in timed),
        "generated": statistics.median(s.generated for s in timed),
        "trained": statistics.median(s.trained for s in timed),
    }


def ratios(ours: dict[str, float], trl: dict[str, float]) -> dict[str, float]:
    """tgc-rl / TRL of the medians: step time (lower is better) and tokens/s (higher is better)."""
    return {
        "step_s": ours["step_s"] / trl["step_s"],
        "tokens_per_s": ours["tokens_per_s"] / trl["tokens_per_s"],
    }


def ours_steps(rows: list[dict], prompt_tokens: list[int], group_size: int) -> list[Step]:
    """Steps from a tgc-rl job's metrics.jsonl rows; `prompt_tokens[k]` is the summed length of step k's prompts
    (each row of a group repeats its prompt, hence `group_size`)."""
    if len(rows) > len(prompt_tokens):
        raise ValueError(f"{len(rows)} metric rows but prompt lengths for {len(prompt_tokens)} steps")
    out = []
    for row, prompts in zip(rows, prompt_tokens, strict=False):
        generated = int(row["response/tokens"])
        out.append(Step(row["timing/step_s"], generated, prompts * group_size + generated))
    return out


def trl_steps(record: dict) -> list[Step]:
    """Steps from the TRL child's last line: per-step seconds, completion tokens, prompt + completion tokens."""
    n = len(record["step_s"])
    if not (len(record["generated"]) == len(record["trained"]) == n):
        raise ValueError(f"TRL record lengths differ: { ({k: len(v) for k, v in record.items()}) }")
    return [
        Step(s, int(g), int(t))
        for s, g, t in zip(record["step_s"], record["generated"], record["trained"], strict=True)
    ]


_TRL_CHILD = r"""
import json, re, sys, time
import torch
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

generated = [0]  # completion tokens seen by the reward function (TRL's ids stop after the first EOS, kept)

def last_number(text):
    found = re.findall(r"-?\d+", text.replace(",", ""))
    return found[-1] if found else None

def reward(completions, answer, completion_ids, **kwargs):
    generated[0] += sum(len(ids) for ids in completion_ids)
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(last_number(t) == a) for t, a in zip(texts, answer)]

class Timer(TrainerCallback):
    # on_step_begin/end bracket one optimizer step: its generation, rewards and every micro-batch
    def __init__(self):
        self.rec = {"step_s": [], "generated": [], "trained": [], "cpu_s": []}
    def on_step_begin(self, args, state, control, **kw):
        self.t0, self.g0, self.n0 = time.perf_counter(), generated[0], state.num_input_tokens_seen
        self.c0 = time.process_time()
    def on_step_end(self, args, state, control, **kw):
        self.rec["step_s"].append(time.perf_counter() - self.t0)
        self.rec["cpu_s"].append(time.process_time() - self.c0)  # all its threads: how much CPU it got
        self.rec["generated"].append(generated[0] - self.g0)
        self.rec["trained"].append(state.num_input_tokens_seen - self.n0)  # GRPOTrainer adds prompt + completion
        print(f"  TRL step {len(self.rec['step_s']) - 1}: {self.rec['step_s'][-1]:.2f} s, CPU {self.rec['cpu_s'][-1]:.2f} s",
              file=sys.stderr, flush=True)

rows = [{"prompt": ([{"role": "system", "content": cfg["system"]}] if cfg["system"] else [])
                   + [{"role": "user", "content": p}], "answer": a} for p, a in zip(cfg["prompts"], cfg["answers"])]
rows_per_step = cfg["prompts_per_step"] * cfg["group_size"]
args = GRPOConfig(output_dir=cfg["out"], per_device_train_batch_size=cfg["micro_batch"],
                  gradient_accumulation_steps=rows_per_step // cfg["micro_batch"],
                  num_generations=cfg["group_size"], max_completion_length=cfg["max_new_tokens"],
                  temperature=cfg["temperature"], learning_rate=cfg["lr"], beta=0.0, **cfg["objective"],
                  max_steps=cfg["steps"], logging_steps=1, bf16=cfg["bf16"], use_cpu=True, report_to="none",
                  save_strategy="no", seed=0, dataloader_num_workers=0, shuffle_dataset=False,
                  include_num_input_tokens_seen="no",  # only GRPOTrainer's own count (prompt + completion)
                  gradient_checkpointing=False)  # TRL's default recomputes activations; tgc-rl's learner does not
timer = Timer()
trainer = GRPOTrainer(model=cfg["model"], reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                      callbacks=[timer])
trainer.train()
print(json.dumps(timer.rec))
"""


def ensure_trl_venv() -> Path:
    py = TRL_VENV / "bin" / "python"
    check = [py, "-c", f"import trl; assert trl.__version__ == '{TRL_VERSION}'"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    subprocess.run(["python3", "-m", "venv", str(TRL_VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU build on this disk, before trl can pick one
    subprocess.run([*pip, f"trl=={TRL_VERSION}"], check=True)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"])
    return py


def job_spec(cfg: Config, args):
    from tgc_rl.config import JobSpec

    data = JobSpec.from_yaml(ROOT / "examples" / "default.yaml").model_dump()
    data["name"] = "bench-vs-trl"
    data["objective"] = {"name": cfg.objective}
    data["sampling"]["temperature"] = cfg.temperature
    data["optim"]["lr"] = cfg.lr
    data["steps"] = args.warmup + args.steps
    data["checkpoint"]["every_steps"] = 0
    if cfg.system_prompt:
        data["model"]["system_prompt"] = system_prompt(args.system_prompt_words)
    return JobSpec.parse(data)


def system_prompt(words: int) -> str:
    base = (
        "You are a careful assistant that answers arithmetic questions. Read the question, add the two "
        "numbers exactly, check the sum once more, and reply with the number alone. "
    ).split()
    return " ".join(base[i % len(base)] for i in range(words))


def step_items(spec, n_steps: int) -> list[list]:
    """The task items of each step, in the order the job takes them (its prompt stream from position 0)."""
    from tgc_rl.tasks import load_task
    from tgc_rl.tasks.grants import job_grants

    task = load_task(spec.task.name, spec.task.params, spec.seed, job_grants())
    k = spec.prompts_per_step
    return [[task.item(s * k + i) for i in range(k)] for s in range(n_steps)]


def run_ours(spec, items: list[list]) -> list[Step]:
    from tgc_rl.models import load_tokenizer
    from tgc_rl.trainer.data import encode_item
    from tgc_rl.trainer.main import run

    tok = load_tokenizer(spec.model)
    prompt_tokens = [sum(len(encode_item(tok, spec.model, it)) for it in step) for step in items]
    with tempfile.TemporaryDirectory() as d:
        run(spec, Path(d), progress=False)
        rows = [json.loads(ln) for ln in (Path(d) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "timing/step_s" in r]
    for i, r in enumerate(rows):
        print(
            f"  tgc-rl step {i}: {r['timing/step_s']:.2f} s (generate {r['timing/generate_s']:.2f}, "
            f"train {r['timing/train_s']:.2f}, sync {r['timing/sync_s']:.2f})",
            flush=True,
        )
    return ours_steps(rows, prompt_tokens, spec.group_size)


def run_trl(
    py: Path, spec, items: list[list], cfg: Config, threads: int, micro_batch: int, env: dict[str, str]
) -> tuple[list[Step], list[float]]:
    """TRL's steps, and its CPU seconds a step (all threads; against `threads` x wall: how much CPU it got);
    `env` is added to TRL's environment."""
    from tgc_rl.config import resolve_dtype
    from tgc_rl.models import model_dir

    flat = [it for step in items for it in step]
    with tempfile.TemporaryDirectory() as d:
        child = {
            "model": str(model_dir(spec.model, spec.seed)),
            "prompts": [i.prompt for i in flat],
            "answers": [i.answer for i in flat],
            "system": spec.model.system_prompt or "",
            "prompts_per_step": spec.prompts_per_step,
            "group_size": spec.group_size,
            "micro_batch": micro_batch,
            "max_new_tokens": spec.sampling.max_new_tokens,
            "temperature": spec.sampling.temperature,
            "lr": spec.optim.lr,
            "objective": cfg.trl,
            "steps": len(items),
            "bf16": resolve_dtype(spec.model.dtype, on_gpu=False) == "bfloat16",
            "threads": threads,
            "out": d,
        }
        res = subprocess.run(
            [str(py), "-c", _TRL_CHILD, json.dumps(child)],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **env},
        )
    record = json.loads(res.stdout.strip().splitlines()[-1])
    return trl_steps(record), record["cpu_s"]


def report(
    name: str, spec, args, trl: list[Step], ours: list[Step], loads: list[float], seconds: float
) -> dict:
    from tgc_rl.config import resolve_dtype

    s_trl, s_ours = summarise(trl, args.warmup), summarise(ours, args.warmup)
    r = ratios(s_ours, s_trl)
    rows = spec.prompts_per_step * spec.group_size
    print(
        f"\n# {name}: tgc-rl ({spec.objective.name}) vs TRL {TRL_VERSION} GRPOTrainer "
        f"({CONFIGS[name].trl['loss_type']}); SmolLM2-135M {resolve_dtype(spec.model.dtype, False)}, "
        f"{spec.prompts_per_step} prompts x G={spec.group_size}, {spec.sampling.max_new_tokens} new tokens, "
        f"temperature {spec.sampling.temperature}, lr {spec.optim.lr:g}, micro-batch {spec.optim.micro_batch_size} rows / "
        f"{spec.optim.micro_batch_tokens} tokens, "
        f"system prompt {args.system_prompt_words if CONFIGS[name].system_prompt else 0} words; "
        f"{args.warmup} warm-up + {args.steps} timed steps each, back to back in {seconds:.0f} s; "
        f"load average (1 min) {', '.join(f'{x:.1f}' for x in loads)} (start, between, end)"
    )
    print(
        f"{'':10s} {'median s':>9s} {'tokens/s':>9s} {'gen tok':>8s} {'trained tok':>12s} {'prompt/row':>11s}  steps"
    )
    for tool, s, steps in (("TRL", s_trl, trl), ("tgc-rl", s_ours, ours)):
        per_row = (s["trained"] - s["generated"]) / rows
        timed = ", ".join(f"{x.seconds:.1f}" for x in steps[args.warmup :])
        warm = ", ".join(f"{x.seconds:.1f}" for x in steps[: args.warmup])
        print(
            f"{tool:10s} {s['step_s']:9.2f} {s['tokens_per_s']:9.1f} {s['generated']:8.0f} {s['trained']:12.0f} "
            f"{per_row:11.1f}  {timed} (warm-up {warm})"
        )
    verdict = "met" if r["step_s"] <= TARGET_STEP_RATIO else "NOT met"
    print(
        f"ratio tgc-rl / TRL: step time {r['step_s']:.3f} (target <= {TARGET_STEP_RATIO}: {verdict}), "
        f"tokens/s {r['tokens_per_s']:.2f}x"
    )
    return {
        "config": name,
        "trl": s_trl,
        "tgc_rl": s_ours,
        "ratio": r,
        "load": loads,
        "trl_steps": [asdict(x) for x in trl],
        "tgc_rl_steps": [asdict(x) for x in ours],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="issue")
    p.add_argument("--steps", type=int, default=6, help="timed steps each, after the warm-up")
    p.add_argument("--warmup", type=int, default=1, help="steps each before the timed ones")
    p.add_argument("--threads", type=int, default=2, help="TRL's torch threads (tgc-rl: the job's 2 CPUs)")
    p.add_argument("--system-prompt-words", type=int, default=110, help="the `long` config's system prompt")
    p.add_argument("--json", type=Path, help="also write the figures and every step here")
    p.add_argument("--update", action="store_true", help="store TRL step / ours as the config's baseline")
    p.add_argument(
        "--trl-micro-batch",
        type=int,
        help="TRL's per-device batch (default: the job's; 64 = no accumulation)",
    )
    p.add_argument(
        "--trl-heap",
        action="store_true",
        help="give TRL the allocator setting tgc-rl's actors run with (tgc_rl.trainer.main.ALLOCATOR_ENV); "
        "no baseline check",
    )
    args = p.parse_args()
    py = ensure_trl_venv()
    cfg = CONFIGS[args.config]
    spec = job_spec(cfg, args)
    items = step_items(spec, args.warmup + args.steps)
    t0, loads = time.time(), [os.getloadavg()[0]]
    trl_mb = args.trl_micro_batch or spec.optim.micro_batch_size
    from tgc_rl.trainer.main import ALLOCATOR_ENV

    trl_env = ALLOCATOR_ENV if args.trl_heap else {}
    trl, trl_cpu = run_trl(py, spec, items, cfg, args.threads, trl_mb, trl_env)
    loads.append(os.getloadavg()[0])
    ours = run_ours(spec, items)
    loads.append(os.getloadavg()[0])
    out = report(args.config, spec, args, trl, ours, loads, time.time() - t0)
    cpu_share = statistics.median(
        c / (s.seconds * args.threads)
        for c, s in zip(trl_cpu[args.warmup :], trl[args.warmup :], strict=True)
    )
    print(f"TRL's CPU seconds / ({args.threads} threads x wall seconds), median: {cpu_share:.2f}")
    out["trl_cpu_share"] = cpu_share
    print(
        f"TRL micro-batch {trl_mb} x {spec.prompts_per_step * spec.group_size // trl_mb} accumulation steps"
    )
    out["trl_micro_batch"] = trl_mb
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    out["trl_env"] = trl_env
    if trl_mb != spec.optim.micro_batch_size or trl_env:
        print("TRL runs with other settings than the job's (micro-batch or allocator): no baseline check")
    elif not guard(f"vs_trl_{args.config}_speedup", 1 / out["ratio"]["step_s"], args.update):
        sys.exit(1)


def guard(key: str, speedup: float, update: bool, path: Path | None = None) -> bool:
    """Checks TRL's median step over ours against its baseline in `path` (regression_guard.py's
    benchmarks/baselines.json and 20% tolerance); `update` stores it instead. False on a regression."""
    from regression_guard import BASELINES, TOLERANCE

    path = path or BASELINES
    base = json.loads(path.read_text()) if path.exists() else {}
    ref = base.get(key)
    if update:
        path.write_text(json.dumps({**base, key: round(speedup, 3)}, indent=2) + "\n")
        print(f"{key} = {speedup:.3f} written to {path} (was {ref})")
        return True
    if ref is None:
        print(f"{key} = {speedup:.3f}: no baseline stored (--update stores it)")
        return True
    slower = speedup < TOLERANCE * ref
    print(f"{key} = {speedup:.3f}, baseline {ref:.3f}, {speedup / ref:.2f}x{'  SLOWER' if slower else ''}")
    return not slower


if __name__ == "__main__":
    main()
