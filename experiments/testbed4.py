"""Testbed 4: does cancellation change outcomes over a long run of the real trainer?

SmolLM2-135M-Instruct learns two-operand addition (operands 0-30) through the project's trainer (Ray, vLLM
CPU engine, FSDP2 learner) for 150 steps per run, one run per objective x seed. The plan, its budget and
why each setting was chosen: `testbed4_plan.md` beside this file.

Each run is measured three ways:
- the trainer's own per-step metrics (training accuracy, D1/D2, entropies, lengths);
- the job's `eval:` section every `eval_every` steps on held-out pairs (sampled pass@8 and mean accuracy
  at the training temperature, one greedy answer per prompt, lengths of right and wrong answers);
- probes of the checkpoint saved at each evaluation (`probe_model`, transformers in float32): the drift of
  equivalent phrasings of a correct answer, the KL from the initial model on unrelated prompts (the
  learning tax), and token entropy on the held-out samples split into shared prefixes, forks and the rest.

A run resumes from its newest checkpoint after a kill on the same machine; its summary
(`results/testbed4_runs/<run>.json`) is written once it has finished and been probed, and committed with
`--commit`, so a study continues on any machine from its committed summaries.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.paths import CACHE, RESULTS
from tgc_rl.trainer.metrics import read_metrics

OBJECTIVES = ("grpo", "grpo_ar", "dr_grpo", "dfpo_min", "cp_grpo", "ibpo_cp")
# Arms dropped after a run showed them to be another arm's run exactly, with that arm: one on-policy epoch makes
# GSPO's sequence ratio 1 and its gradient GRPO's (tb4-gspo-s0 reproduced tb4-grpo-s0 to the last digit).
SAME_AS = {"gspo": "grpo"}
SEEDS = (0, 1, 2)
DATA = RESULTS / "testbed4"
RUNS = RESULTS / "testbed4_runs"
MAX_OPERAND = 99
HELDOUT_PAIRS = 64  # unordered pairs {a, b}: both orders of a pair are in the same split
TEMPLATE = "What is {a} + {b}? Reply with just the number."

PLAN: dict[str, Any] = {
    "model": {"source": "smollm2-135m-instruct", "dtype": "auto"},
    "steps": 150,
    "prompts_per_step": 8,
    "group_size": 8,
    "temperature": 0.7,
    "max_new_tokens": 24,
    "lr": 3e-5,
    "micro_batch_size": 16,
    "eval_every": 25,
    "eval_prompts": 128,
    "eval_samples": 8,
    "accuracy_threshold": 0.5,  # steps to reach it: 10-step moving mean of training accuracy
}

# Equivalent ways to give a correct answer: the verifier accepts each (it reads the last number), so how the
# policy spreads probability over them is a choice no reward can prefer.
PHRASINGS = (
    "{c}",
    "{c}.",
    "The answer is {c}.",
    "{a} + {b} = {c}",
    "{a} + {b} = {c}.",
    "{a} + {b} equals {c}.",
    "The sum of {a} and {b} is {c}.",
    "{c} is the answer.",
)
PHRASE_PROMPTS = 32

# Unrelated prompts for the learning tax: nothing the task rewards touches them.
PROBE_PROMPTS = (
    "Name three colours of the rainbow.",
    "Write one sentence about the sea.",
    "What is the capital of France?",
    "Give me a synonym for happy.",
    "Describe a cat in five words.",
    "What do bees make?",
    "Suggest a name for a small boat.",
    "Translate 'good morning' into Spanish.",
    "What season comes after winter?",
    "Write a short greeting for a birthday card.",
    "Why is the sky blue? Answer briefly.",
    "List two fruits that are yellow.",
    "What is a verb?",
    "Tell me a fun fact about owls.",
    "How many days are in a week?",
    "What should I pack for a picnic?",
    "Write a haiku about autumn leaves.",
    "What instrument has 88 keys?",
    "Explain what a map is to a child.",
    "Which animal is known as the king of the jungle?",
    "What is the opposite of cold?",
    "Recommend a hobby for a rainy day.",
    "What do plants need to grow?",
    "Say something kind to a friend.",
)
PROBE_TOKENS = 32
ENTROPY_PROMPTS = 32


# ---------------------------------------------------------------- data and job specs


def addition_rows(max_operand: int = MAX_OPERAND, heldout_pairs: int = HELDOUT_PAIRS, seed: int = 4):
    """(train rows, held-out rows): every ordered pair a + b with 0 <= a, b <= max_operand; a fixed draw of
    unordered pairs is held out with both of its orders, so no held-out question is a commuted training one."""
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(a, max_operand + 1)]
    held = set(random.Random(seed).sample(pairs, heldout_pairs))
    train, heldout = [], []
    for a in range(max_operand + 1):
        for b in range(max_operand + 1):
            row = {
                "id": f"add-{a}-{b}",
                "prompt": TEMPLATE.format(a=a, b=b),
                "answer": str(a + b),
                "verifier": "math",
                "a": a,
                "b": b,
            }
            (heldout if (min(a, b), max(a, b)) in held else train).append(row)
    random.Random(seed).shuffle(heldout)  # eval.max_prompts takes the first rows: a mix of pairs
    return train, heldout


def write_data(folder: Path = DATA) -> tuple[Path, Path]:
    """The study's train and held-out files (JSONL), written once and committed."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.jsonl", folder / "heldout.jsonl"
    for path, rows in zip(paths, addition_rows(), strict=True):
        text = "".join(json.dumps(r) + "\n" for r in rows)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return paths


def run_name(objective: str, seed: int, lr: float | None = None, steps: int | None = None) -> str:
    """The plan's runs are `tb4-<objective>-s<seed>`; other settings are named, so they never pass for one."""
    tag = ("" if lr is None else f"-lr{lr:g}") + ("" if steps is None else f"-n{steps}")
    return f"tb4-{objective}-s{seed}{tag}".replace("_", "-")


def job_spec(
    objective: str, seed: int, plan: dict[str, Any] = PLAN, steps: int | None = None, lr: float | None = None
) -> dict[str, Any]:
    """One run's job spec (valid for `JobSpec.parse`, the REST API and the SDK)."""
    train, heldout = write_data()
    name = run_name(objective, seed, lr, steps)
    steps = plan["steps"] if steps is None else steps
    return {
        "name": name,
        "model": plan["model"],
        "task": {"name": "dataset", "params": {"path": str(train), "id_column": "id"}, "reward_workers": 1},
        "objective": {"name": objective},
        "group_size": plan["group_size"],
        "prompts_per_step": plan["prompts_per_step"],
        "steps": steps,
        "seed": seed,
        "sampling": {"temperature": plan["temperature"], "max_new_tokens": plan["max_new_tokens"]},
        "optim": {"lr": plan["lr"] if lr is None else lr, "micro_batch_size": plan["micro_batch_size"]},
        "resources": {"learner_ranks": 1, "rollout_replicas": 1, "rollout_engine": "vllm"},
        "eval": {
            "dataset": {"path": str(heldout), "id_column": "id"},
            "every_steps": plan["eval_every"],
            "samples_per_prompt": plan["eval_samples"],
            "greedy": False,
            "also_greedy": True,
            "temperature": plan["temperature"],
            "max_prompts": plan["eval_prompts"],
        },
        # A checkpoint at each evaluation: the probes read its weights, and a killed run resumes from the
        # newest one exactly (AdamW moments included). All are removed once the run is probed.
        "checkpoint": {"every_steps": plan["eval_every"], "keep_last": 1 + steps // plan["eval_every"]},
    }


# ---------------------------------------------------------------- probes of one model


class Prober:
    """Teacher-forced measurements of a model against the initial one (transformers, float32, CPU)."""

    def __init__(
        self,
        base_path: Path,
        tokenizer,
        heldout: Sequence[dict[str, Any]],
        phrase_prompts: int = PHRASE_PROMPTS,
        probe_prompts: Sequence[str] = PROBE_PROMPTS,
        probe_tokens: int = PROBE_TOKENS,
    ):
        import torch

        self.torch, self.tok, self.probe_tokens = torch, tokenizer, probe_tokens
        self.rows = {r["id"]: r for r in heldout}
        self.phrase_rows = list(heldout)[:phrase_prompts]
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        base = self._load(base_path)
        self.probe_seqs = [self._greedy(base, self._chat(p)) for p in probe_prompts]
        self.base_probe = self._answer_logprobs(base, self.probe_seqs)
        self.base_phrases = self._phrase_logprobs(base)

    def _load(self, path: Path):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, dtype=self.torch.float32).eval()

    def _chat(self, text: str) -> list[int]:
        ids = self.tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def _greedy(self, model, prompt: list[int]) -> tuple[list[int], list[int]]:
        with self.torch.no_grad():
            out = model.generate(
                self.torch.tensor([prompt]),
                max_new_tokens=self.probe_tokens,
                do_sample=False,
                pad_token_id=self.end,
            )
        return prompt, out[0, len(prompt) :].tolist()

    def _answer_logprobs(self, model, pairs: Sequence[tuple[list[int], list[int]]], batch: int = 16):
        """For each (prompt, answer): the model's next-token log-distributions at the answer's positions,
        (len(answer), V) float64. Right-padded batches (padding after a sequence cannot change it)."""
        torch, out = self.torch, []
        for i in range(0, len(pairs), batch):
            part = pairs[i : i + batch]
            seqs = [p + a for p, a in part]
            width = max(map(len, seqs))
            ids = torch.tensor([s + [self.end] * (width - len(s)) for s in seqs])
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=mask).logits
            for row, (p, a) in zip(logits, part, strict=True):
                out.append(torch.log_softmax(row[len(p) - 1 : len(p) + len(a) - 1].double(), -1))
        return out

    def _phrase_logprobs(self, model) -> np.ndarray:
        """(prompts, phrasings): log p(phrasing + end of turn | question) of each equivalent answer."""
        pairs = []
        for row in self.phrase_rows:
            prompt = self._chat(row["prompt"])
            for form in PHRASINGS:
                text = form.format(a=row["a"], b=row["b"], c=row["answer"])
                pairs.append((prompt, [*self.tok(text, add_special_tokens=False)["input_ids"], self.end]))
        lps = self._answer_logprobs(model, pairs)
        scores = [
            float(lp.gather(1, self.torch.tensor(a)[:, None]).sum())
            for lp, (_, a) in zip(lps, pairs, strict=True)
        ]
        return np.asarray(scores).reshape(len(self.phrase_rows), len(PHRASINGS))

    def probe(self, path: Path, samples: list[dict[str, Any]] | None) -> dict[str, float]:
        model = self._load(path)
        metrics = phrase_metrics(self._phrase_logprobs(model), self.base_phrases)
        kls = [
            float((lp.exp() * (lp - base)).sum(-1).mean())
            for lp, base in zip(self._answer_logprobs(model, self.probe_seqs), self.base_probe, strict=True)
        ]
        metrics["probe/kl_from_start"] = float(np.mean(kls))
        if samples:
            metrics.update(self._entropies(model, samples))
        return metrics

    def _entropies(self, model, samples: list[dict[str, Any]]) -> dict[str, float]:
        """Token entropy of the held-out sampled answers (re-tokenised from their text) under the model that
        sampled them, on positions two or more answers of a prompt share (prefix-tree nodes), at forks (the
        first token after a shared prefix) and overall."""
        by_row: dict[str, list[dict[str, Any]]] = {}
        for s in samples:
            if s.get("mode", "sampled") == "sampled":
                by_row.setdefault(s["row"], []).append(s)
        pairs, labels = [], []
        for row in list(by_row)[:ENTROPY_PROMPTS]:
            prompt = self._chat(self.rows[row]["prompt"])
            answers = [
                [*self.tok(s["response"], add_special_tokens=False)["input_ids"], self.end]
                for s in by_row[row]
            ]
            pairs += [(prompt, a) for a in answers]
            labels += position_kinds(answers)
        kinds: dict[str, list[float]] = {"all": [], "shared": [], "fork": []}
        for lp, kind_of in zip(self._answer_logprobs(model, pairs), labels, strict=True):
            for h, kind in zip((-(lp.exp() * lp).sum(-1)).tolist(), kind_of, strict=True):
                kinds["all"].append(h)
                if kind:
                    kinds[kind].append(h)
        return {f"entropy/{k}": float(np.mean(v)) if v else math.nan for k, v in kinds.items()}


def answer_format(response: str) -> str:
    """An answer's form with its numbers blanked: "75 + 58 = 133" and "12 + 9 = 21" are both "N + N = N"."""
    return " ".join(re.sub(r"\d+", "N", response).split())


def format_metrics(samples: Sequence[dict[str, Any]]) -> dict[str, float]:
    """How far the held-out answers have settled on one form (a reward-irrelevant choice; the verifier reads
    the last number): the share of the most common form among the greedy and among the sampled answers, and
    how many forms the sampled answers take."""
    out = {}
    for mode in ("greedy", "sampled"):
        forms = Counter(answer_format(s["response"]) for s in samples if s.get("mode", "sampled") == mode)
        total = sum(forms.values())
        out[f"format/{mode}_top_share"] = forms.most_common(1)[0][1] / total if total else math.nan
        if mode == "sampled":
            out["format/sampled_forms"] = float(len(forms)) if total else math.nan
    return out


def position_kinds(answers: Sequence[Sequence[int]]) -> list[list[str]]:
    """Per answer and position: 'shared' when another answer has the same tokens up to and including it,
    'fork' when another answer shares the prefix before it but not it, else ''."""
    out = []
    for i, ans in enumerate(answers):
        labels = []
        for t in range(len(ans)):
            same_prefix = [o for j, o in enumerate(answers) if j != i and list(o[:t]) == list(ans[:t])]
            if any(len(o) > t and o[t] == ans[t] for o in same_prefix):
                labels.append("shared")
            elif same_prefix:
                labels.append("fork")
            else:
                labels.append("")
        out.append(labels)
    return out


def phrase_metrics(logp: np.ndarray, base: np.ndarray) -> dict[str, float]:
    """Drift of the policy's split of probability over equivalent correct answers, from the initial split.

    q = softmax over phrasings per prompt. kl_from_start: mean KL(q || q_0); entropy: mean H(q) in nats
    (collapse onto one form lowers it); top_share: mean largest q; log_mass: mean log of the total
    probability of the equivalent forms (how likely a correct answer in any of them is)."""

    def split(x: np.ndarray) -> np.ndarray:
        z = x - x.max(1, keepdims=True)
        return z - np.log(np.exp(z).sum(1, keepdims=True))

    lq, lq0 = split(logp), split(base)
    q = np.exp(lq)
    top = np.log(np.exp(logp - logp.max(1, keepdims=True)).sum(1)) + logp.max(1)
    return {
        "phrase/kl_from_start": float((q * (lq - lq0)).sum(1).mean()),
        "phrase/entropy": float(-(q * lq).sum(1).mean()),
        "phrase/top_share": float(q.max(1).mean()),
        "phrase/log_mass": float(top.mean()),
        **{f"phrase/share_{j}": float(share) for j, share in enumerate(q.mean(0))},
    }


# ---------------------------------------------------------------- one run, and the study


CURVES = (
    "reward/accuracy",
    "diag/d1_gcpr",
    "diag/d2_residual",
    "diag/d2_nodes",
    "diag/d7_entropy_mean",
    "diag/d7_entropy_divergent",
    "diag/d11_len_pos_mean",
    "diag/d11_len_neg_mean",
    "response/length_mean",
    "response/truncated_frac",
    "timing/step_s",
)
EVAL_KEYS = (
    "eval/accuracy",
    "eval/pass@8",
    "eval/greedy/accuracy",
    "eval/length_correct_mean",
    "eval/length_incorrect_mean",
    "eval/response_length_mean",
)


def summarise_run(
    metrics: list[dict[str, Any]], probes: dict[int, dict[str, float]], plan: dict[str, Any] = PLAN
) -> dict[str, Any]:
    """One run's compact record: per-step curves, the evaluations with their probes, and headline numbers."""
    steps = [int(m["step"]) for m in metrics if m["step"] > 0]
    curves = {k: [as_float(m.get(k)) for m in metrics if m["step"] > 0] for k in CURVES}
    evals = {
        int(m["step"]): {
            **{k: as_float(m.get(k)) for k in EVAL_KEYS},
            **probes.get(int(m["step"]), {}),
        }
        for m in metrics
        if "eval/accuracy" in m
    }
    acc = np.asarray(curves["reward/accuracy"], dtype=float)
    window = 10
    smooth = np.convolve(acc, np.ones(window) / window, mode="valid") if len(acc) >= window else acc[:0]
    hit = np.nonzero(smooth >= plan["accuracy_threshold"])[0]
    d2 = np.asarray(curves["diag/d2_residual"], dtype=float)
    return {
        "steps": steps,
        "curves": curves,
        "evals": {str(k): v for k, v in sorted(evals.items())},
        "final": {
            "steps_to_threshold": float(steps[hit[0] + window - 1]) if len(hit) else math.nan,
            "d2_residual_mean": float(np.nanmean(d2)) if np.isfinite(d2).any() else math.nan,
            "train_accuracy_last25": float(np.nanmean(acc[-25:])) if len(acc) else math.nan,
        },
    }


def as_float(v: Any) -> float:
    """A logged number as a float; anything else (missing, None, text) as NaN."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def run_one(
    spec_dict: dict[str, Any], prober_for: Callable[[], Prober], cache: Path, log: Callable[[str], None]
) -> dict[str, Any] | None:
    """Train (or resume) one run, probe its checkpoints, return its summary (None: the run failed; a
    cancelled run exits the study)."""
    from tgc_rl.config import JobSpec
    from tgc_rl.trainer.checkpoints import Checkpoints
    from tgc_rl.trainer.main import run as train

    run_dir = Path(cache) / "testbed4" / spec_dict["name"]
    spec = JobSpec.parse(spec_dict)
    resume = "latest" if Checkpoints(run_dir / "checkpoints", spec.checkpoint.keep_last).latest() else None
    log(f"{spec.name}: {'resuming' if resume else 'starting'} ({spec.steps} steps)")
    t0 = time.perf_counter()
    state = train(spec, run_dir, resume=resume, progress=False)
    seconds = time.perf_counter() - t0
    if state != "succeeded":
        log(f"{spec.name}: {state}; checkpoints kept for a resume")
        if state == "cancelled":  # Ctrl-C or SIGTERM stops the study, not only this run
            raise SystemExit(130)
        return None
    metrics = read_metrics(run_dir)
    prober = prober_for()
    probes: dict[int, dict[str, float]] = {}
    t1 = time.perf_counter()
    for m in metrics:
        if "eval/accuracy" not in m:
            continue
        step = int(m["step"])
        path = base_model_path() if step == 0 else run_dir / "checkpoints" / f"step_{step}" / "model"
        samples_file = run_dir / "eval" / f"step_{step}.jsonl"
        samples = (
            [json.loads(x) for x in samples_file.read_text().splitlines()] if samples_file.exists() else None
        )
        probes[step] = {**prober.probe(path, samples), **(format_metrics(samples) if samples else {})}
    summary = {
        **summarise_run(metrics, probes),
        "name": spec.name,
        "objective": spec_dict["objective"]["name"],
        "seed": spec.seed,
        "lr": spec.optim.lr,
        "seconds": seconds,
        "probe_seconds": time.perf_counter() - t1,
        "spec": spec_dict,
    }
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # ~1.3 GB each with AdamW moments
    return summary


def base_model_path() -> Path:
    from tgc_rl.config import ModelSpec
    from tgc_rl.models import model_dir

    return model_dir(ModelSpec.model_validate(PLAN["model"]))


def make_prober(**sizes: Any) -> Prober:
    """The study's prober (`sizes`: smaller probe sets and answers, for tests)."""
    from tgc_rl.config import ModelSpec
    from tgc_rl.models import load_tokenizer

    tok = load_tokenizer(ModelSpec.model_validate(PLAN["model"]))
    heldout = [json.loads(x) for x in write_data()[1].read_text().splitlines()]
    return Prober(base_model_path(), tok, heldout, **sizes)


Run = tuple[str, int, float | None, int | None]  # objective, seed, lr (None: the plan's), steps


def select(
    objectives: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    lrs: Sequence[float] | None = None,
    steps: int | None = None,
) -> list[Run]:
    """The runs to do, seed-major so that a part-done study has every objective at its first seeds."""
    from rlcore import PRESETS

    unknown = sorted(set(objectives or ()) - set(PRESETS))
    if unknown:
        raise ValueError(
            f"--objectives: unknown {', '.join(unknown)}; the study's are {', '.join(OBJECTIVES)}"
        )
    if steps is not None and not 1 <= steps <= 10_000:
        raise ValueError(f"--steps {steps}: must be between 1 and 10000")
    return [
        (objective, seed, lr, steps)
        for seed in (SEEDS if seeds is None else seeds)
        for lr in (lrs or [None])
        for objective in (objectives or OBJECTIVES)
    ]


def run_study(
    runs: Iterable[Run],
    out: Path = RUNS,
    cache: Path = CACHE,
    commit: bool = False,
    lock: Path | None = None,
    log: Callable[[str], None] = print,
) -> list[Path]:
    """Do the runs one after another, skipping those with a summary in `out`; with `lock`, each run holds
    that file's lock while it trains and is probed (one heavy job at a time on a shared machine)."""
    import fcntl

    import ray

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    prober: Prober | None = None

    def get_prober() -> Prober:
        nonlocal prober
        if prober is None:
            prober = make_prober()
        return prober

    started = False
    try:
        for objective, seed, lr, steps in runs:
            spec_dict = job_spec(objective, seed, steps=steps, lr=lr)
            path = out / f"{spec_dict['name']}.json"
            if path.exists():
                log(f"{spec_dict['name']}: done before ({path.name})")
                continue
            with open(lock or "/dev/null", "a+") as held:
                if lock is not None:
                    log(f"{spec_dict['name']}: waiting for {lock}")
                    fcntl.flock(held, fcntl.LOCK_EX)
                if not ray.is_initialized():
                    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
                    started = True
                summary = run_one(spec_dict, get_prober, cache, log)
            if summary is None:
                continue
            path.write_text(json.dumps(summary, indent=1, allow_nan=True))
            log(f"{spec_dict['name']}: {summary['seconds']:.0f}s + probes {summary['probe_seconds']:.0f}s")
            written.append(path)
            if commit:
                subprocess.run(["git", "add", str(path)], check=True)
                subprocess.run(
                    ["git", "commit", "-q", "-m", f"Testbed 4: run {spec_dict['name']}", "--", str(path)],
                    check=True,
                )
    finally:
        if started:
            ray.shutdown()
    return written
