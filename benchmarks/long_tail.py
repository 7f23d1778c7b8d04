"""Long-tail generation (issue 33, item 3): how idle a rollout engine runs while a step's groups wait for their
longest response, and what admitting the next step's groups into the freed slots would win.

Drives one in-process vLLM engine (the rollout replica's own `engine_args`) iteration by iteration, so that the
running requests, each iteration's time and each request's finish time are seen directly. Two ways to feed it
two steps' prompts (P prompts x G samples each, sampled lengths, the same seeds in both):

- `sequential`: a step's P x G requests at once, the next step's after the last of them finished. This is what
  the engine sees in every async mode today: the trainer (sync) or the k_step worker thread makes one
  `RolloutPool.generate` call per step, and the replica runs one call at a time.
- `refill`: the next step's groups are admitted, a whole group at a time, as soon as P x G minus the running
  requests leaves room for G more (the batch never exceeds P x G). No weight update happens between the two
  steps, so every group is still sampled by one weights version.
- `joint`: every step's requests at once, one batch of steps x P x G: what the engine gets from one
  `generate` call of `async.steps_per_call` steps (k_step).

Quantities (per window = the time from the first request added to the last one finished):
- peak throughput = tokens per second of the decode iterations that ran the full batch (P x G requests, no
  request admitted just before: no prefill in them);
- idle fraction = 1 - tokens generated / (peak throughput x wall time): the share of the window the engine
  would not have needed had every token been decoded at the full batch's rate;
- mean running = time-weighted mean of the running requests over the window;
- first / last group = when the first / last group's G responses were all done; "wait" = last - first, how long
  the reward pool and the trainer wait for the step after its first group could have been scored.

    flock /tmp/tgc-heavy.lock .venv/bin/python benchmarks/long_tail.py [--max-tokens 512 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Mode = Literal["sequential", "refill", "joint"]
# the countdown task with its worked answer asked for first: lengths of a reasoning task, sampled as they come
REASONING_TEMPLATE = (
    "Using the numbers {numbers}, write an arithmetic expression that equals {target}. You may use +, -, *, / "
    "and parentheses, and each number at most once. Think it through step by step first, trying combinations "
    "and checking each one, then give the expression in <answer></answer> tags."
)


@dataclass(frozen=True)
class Request:
    id: int
    step: int  # which step's prompts (0, 1, ...)
    group: int  # the group's index over all steps
    sample: int  # its index in the group
    prompt: list[int]
    params: Any  # vLLM SamplingParams (anything the engine takes)


@dataclass(frozen=True)
class Iteration:
    start: float  # seconds since the window started
    seconds: float
    running: int  # requests unfinished when it began
    prefill: bool  # a request was admitted just before it (its prompt is computed in it)


@dataclass(frozen=True)
class Finished:
    id: int
    step: int
    group: int
    sample: int
    tokens: list[int]
    at: float  # seconds since the window started
    truncated: bool


@dataclass
class Window:
    mode: Mode
    batch: int
    iterations: list[Iteration] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)
    wall: float = 0.0


class Engine(Protocol):
    """What `drive` needs of vLLM's LLMEngine."""

    def add_request(self, request_id: str, prompt: Any, params: Any) -> Any: ...

    def step(self) -> list[Any]: ...

    def get_num_unfinished_requests(self) -> int: ...


def drive(
    engine: Engine,
    requests: Sequence[Request],
    batch: int,
    mode: Mode,
    clock: Callable[[], float] = time.perf_counter,
) -> Window:
    """Run `requests` (in step and group order) to completion; admit a group whole, never past `batch`
    running requests; in `sequential` mode a step's groups only once every earlier step's request finished."""
    groups: list[list[Request]] = []
    for r in requests:
        if groups and groups[-1][0].group == r.group:
            groups[-1].append(r)
        else:
            groups.append([r])
    if any(len(g) > batch for g in groups):
        raise ValueError(f"a group of more than batch={batch} requests can never be admitted whole")
    by_id = {r.id: r for r in requests}
    window = Window(mode, batch)
    unfinished_steps: dict[int, int] = {}  # step -> its admitted requests not yet finished
    t0 = clock()
    while groups or engine.get_num_unfinished_requests():
        running = engine.get_num_unfinished_requests()
        admitted = False
        while groups and running + len(groups[0]) <= batch:
            step = groups[0][0].step
            if mode == "sequential" and any(n for s, n in unfinished_steps.items() if s < step):
                break
            group = groups.pop(0)
            for r in group:
                engine.add_request(str(r.id), {"prompt_token_ids": r.prompt}, r.params)
            unfinished_steps[step] = unfinished_steps.get(step, 0) + len(group)
            running, admitted = engine.get_num_unfinished_requests(), True
        if not running:
            raise RuntimeError("no request running and none admitted: the admission rule is stuck")
        start = clock()
        outputs = engine.step()
        end = clock()
        window.iterations.append(Iteration(start - t0, end - start, running, admitted))
        for out in outputs:
            if not out.finished:
                continue
            r = by_id[int(out.request_id)]
            ids = list(out.outputs[0].token_ids)
            window.finished.append(
                Finished(
                    r.id, r.step, r.group, r.sample, ids, end - t0, out.outputs[0].finish_reason == "length"
                )
            )
            unfinished_steps[r.step] -= 1
    window.wall = clock() - t0
    return window


# -- what a window says -------------------------------------------------------------------------------------
def peak_throughput(windows: Sequence[Window]) -> float:
    """Tokens per second of the full-batch decode iterations of `windows` (one token per running request each)."""
    full = [it for w in windows for it in w.iterations if it.running == w.batch and not it.prefill]
    if not full:
        raise ValueError("no iteration ran the full batch without a prefill: the peak cannot be measured")
    return sum(it.running for it in full) / sum(it.seconds for it in full)


@dataclass(frozen=True)
class Summary:
    mode: str
    requests: int
    tokens: int
    wall: float
    tokens_per_s: float
    idle: float  # 1 - tokens / (peak x wall)
    mean_running: float  # time-weighted over the window
    first_group: float  # seconds until the first group's responses were all done
    last_group: float
    wait: float  # last_group - first_group


def summarise(window: Window, peak: float) -> Summary:
    if not window.finished or window.wall <= 0:
        raise ValueError("an empty window has nothing to summarise")
    tokens = sum(len(f.tokens) for f in window.finished)
    done: dict[int, float] = {}
    for f in window.finished:
        done[f.group] = max(done.get(f.group, 0.0), f.at)
    busy = sum(it.running * it.seconds for it in window.iterations)
    return Summary(
        mode=window.mode,
        requests=len(window.finished),
        tokens=tokens,
        wall=window.wall,
        tokens_per_s=tokens / window.wall,
        idle=1.0 - tokens / (peak * window.wall),
        mean_running=busy / window.wall,
        first_group=min(done.values()),
        last_group=max(done.values()),
        wait=max(done.values()) - min(done.values()),
    )


def combine(windows: Sequence[Window]) -> Window:
    """Windows run one after another as one window (the sequential feed of several steps)."""
    out = Window(windows[0].mode, windows[0].batch)
    offset = 0.0
    for w in windows:
        out.iterations += [
            Iteration(it.start + offset, it.seconds, it.running, it.prefill) for it in w.iterations
        ]
        out.finished += [
            Finished(f.id, f.step, f.group, f.sample, f.tokens, f.at + offset, f.truncated)
            for f in w.finished
        ]
        offset += w.wall
    out.wall = offset
    return out


def iteration_seconds_by_running(windows: Sequence[Window]) -> dict[int, float]:
    """Median seconds of a decode iteration (no prefill) at each running count seen."""
    seen: dict[int, list[float]] = {}
    for w in windows:
        for it in w.iterations:
            if not it.prefill:
                seen.setdefault(it.running, []).append(it.seconds)
    return {n: statistics.median(s) for n, s in sorted(seen.items())}


def occupancy(window: Window, bins: int = 10) -> list[float]:
    """Time-weighted mean running requests in each of `bins` equal slices of the window."""
    edges = [window.wall * i / bins for i in range(bins + 1)]
    out = []
    for a, b in zip(edges, edges[1:], strict=False):
        busy = 0.0
        for it in window.iterations:
            lo, hi = max(a, it.start), min(b, it.start + it.seconds)
            if hi > lo:
                busy += it.running * (hi - lo)
        out.append(busy / (b - a))
    return out


def lengths(window: Window) -> dict[str, float]:
    n = sorted(len(f.tokens) for f in window.finished)
    q = statistics.quantiles(n, n=20, method="inclusive")  # 5% steps
    return {
        "mean": statistics.fmean(n),
        "min": n[0],
        "p25": q[4],
        "median": statistics.median(n),
        "p75": q[14],
        "p90": q[17],
        "max": n[-1],
        "truncated": float(sum(f.truncated for f in window.finished)),
    }


# -- the run ------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4, help="prompts a step (P)")
    ap.add_argument("--samples", type=int, default=8, help="samples a prompt (G)")
    ap.add_argument("--steps", type=int, default=2, help="steps' prompts fed to each mode")
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"])
    ap.add_argument("--json", type=Path, help="write every window's iterations and finishes here")
    ap.add_argument(
        "--modes",
        nargs="+",
        default=["sequential", "refill", "joint"],
        choices=["sequential", "refill", "joint"],
    )
    args = ap.parse_args()
    if "sequential" not in args.modes:
        ap.error("--modes: the others are measured against sequential; include it")

    import torch

    from tgc_rl.config import JobSpec
    from tgc_rl.models import load_tokenizer, model_dir
    from tgc_rl.rollout import RolloutSpec, sample_seed
    from tgc_rl.rollout.vllm_engine import engine_args, in_process_llm, sampling_params
    from tgc_rl.tasks.countdown import CountdownParams, CountdownTask
    from tgc_rl.trainer.data import derive_seed

    P, G, batch = args.prompts, args.samples, args.prompts * args.samples
    longest = max(args.max_tokens)
    spec = JobSpec.parse(
        {
            "name": "bench-long-tail",
            "model": {"dtype": args.dtype},  # SmolLM2-135M-Instruct, the embedded default
            "sampling": {"max_new_tokens": longest, "max_prompt_tokens": 128, "temperature": 1.0},
            "resources": {"rollout_engine": "vllm", "cpus_per_rollout": args.threads},
        }
    )
    rspec = RolloutSpec.of(spec)
    path = model_dir(spec.model, spec.seed)
    tok = load_tokenizer(spec.model)
    task = CountdownTask(seed=0, params=CountdownParams(template=REASONING_TEMPLATE))
    prompts = []
    for i in range(P * args.steps):
        enc = tok.apply_chat_template(
            [{"role": "user", "content": task.item(i).prompt}], add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))

    torch.set_num_threads(args.threads)
    eng_args = engine_args(rspec, path)
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    per_token = (
        2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    )
    per_token *= 2 if args.dtype == "bfloat16" else 4
    # room for every step's requests at the longest length (and a block's rounding each): none is preempted;
    # the sequential and refill feeds keep at most `batch` running themselves
    most = batch * args.steps
    eng_args.update(
        kv_cache_memory_bytes=int(1.25 * most * eng_args["max_model_len"] * per_token), max_num_seqs=most
    )
    t0 = time.perf_counter()
    llm = in_process_llm(eng_args)
    start_s = time.perf_counter() - t0
    engine = llm.llm_engine
    eos = int(tok.eos_token_id)

    from vllm.sampling_params import RequestOutputKind

    next_id = 0

    def requests(max_tokens: int) -> list[Request]:
        nonlocal next_id
        out = []
        for i, p in enumerate(prompts):
            for j in range(G):
                params = sampling_params(rspec, sample_seed(derive_seed(spec.seed, i), j), eos)
                params.max_tokens = max_tokens
                # the engine returns a request once, when it finished
                params.output_kind = RequestOutputKind.FINAL_ONLY
                out.append(Request(next_id, i // P, i, j, p, params))
                next_id += 1
        return out

    # warm-up: the first iterations set up kernels and buffers
    drive(engine, [r for r in requests(16) if r.step == 0], batch, "sequential")

    report: dict[str, Any] = {"start_s": start_s, "lengths": {}}
    print(
        f"\nLong-tail generation  (SmolLM2-135M-Instruct {args.dtype}, vLLM {__import__('vllm').__version__} CPU, "
        f"{args.threads} threads, {args.steps} steps x {P} prompts x {G} samples, batch cap {batch}, "
        f"countdown prompts asking for the steps, temperature 1.0; engine start {start_s:.1f} s)"
    )
    for n, max_tokens in enumerate(args.max_tokens):
        reqs = requests(max_tokens)
        runs: dict[str, list[Window]] = {}
        # alternate which mode goes first, so that a burst of others' load does not always hit the same one
        for mode in args.modes if n % 2 == 0 else args.modes[::-1]:
            if mode == "sequential":  # one call a step, as the trainer and the k_step worker make them
                by_step = [[r for r in reqs if r.step == s] for s in range(args.steps)]
                runs[mode] = [drive(engine, rs, batch, "sequential") for rs in by_step]
            elif mode == "refill":
                runs[mode] = [drive(engine, reqs, batch, "refill")]
            else:  # one call of every step's prompts (async.steps_per_call): all admitted at once
                runs[mode] = [drive(engine, reqs, len(reqs), "joint")]
        # every feed's idle against one rate: the P x G batch's full-batch decode (a joint call has too few
        # iterations with its whole batch running, one of them finishing its prefill, to measure its own)
        peak = peak_throughput([w for mode in ("sequential", "refill") if mode in runs for w in runs[mode]])
        seq_all = combine(runs["sequential"])
        tokens_of = lambda w: {(f.group, f.sample): f.tokens for f in w.finished}  # noqa: E731
        a = tokens_of(seq_all)
        same = {
            m: sum(a[k] == tokens_of(runs[m][0]).get(k) for k in a) / len(a)
            for m in runs
            if m != "sequential"
        }
        rows = [(f"sequential step {s}", summarise(w, peak)) for s, w in enumerate(runs["sequential"])]
        rows += [("sequential, all steps", summarise(seq_all, peak))]
        rows += [(f"{m}, all steps", summarise(runs[m][0], peak)) for m in runs if m != "sequential"]
        every = [w for ws in runs.values() for w in ws]
        per_it = iteration_seconds_by_running(every)
        dist = lengths(seq_all)
        print(f"\nmax_tokens {max_tokens}: peak throughput (full-batch decode iterations) {peak:.1f} tok/s")
        print(
            "response lengths (sequential): "
            + ", ".join(f"{k} {v:.0f}" for k, v in dist.items())
            + f" of {len(seq_all.finished)}"
        )
        print(
            f"{'window':<24} {'reqs':>5} {'tokens':>7} {'wall s':>8} {'tok/s':>7} {'idle':>6} {'mean run':>8} "
            f"{'1st grp s':>9} {'last grp s':>10} {'wait s':>7}"
        )
        for name, s in rows:
            print(
                f"{name:<24} {s.requests:>5} {s.tokens:>7} {s.wall:>8.2f} {s.tokens_per_s:>7.1f} {s.idle:>6.3f} "
                f"{s.mean_running:>8.1f} {s.first_group:>9.2f} {s.last_group:>10.2f} {s.wait:>7.2f}"
            )
        ratios = {m: runs[m][0].wall / seq_all.wall for m in runs if m != "sequential"}
        for m, ratio in ratios.items():
            print(f"{m} / sequential wall: {ratio:.3f}; responses identical to sequential's: {same[m]:.3f}")
        shown = [k for k in per_it if k in (1, 2, 4, 8, 16, 24, batch, len(reqs))]
        print(
            "median decode iteration s by running requests: "
            + ", ".join(f"{k}: {per_it[k]:.4f} ({k / per_it[k]:.0f} tok/s)" for k in shown)
        )
        for name, w in [("sequential step 0", runs["sequential"][0])] + [(m, runs[m][0]) for m in ratios]:
            print(f"occupancy by tenth of the window, {name}: " + " ".join(f"{x:.1f}" for x in occupancy(w)))
        report["lengths"][str(max_tokens)] = {
            "peak_tokens_per_s": peak,
            "response_lengths": dist,
            "summaries": {name: asdict(s) for name, s in rows},
            "over_sequential_wall": ratios,
            "identical_to_sequential": same,
            "iteration_s_by_running": per_it,
            "windows": {mode: [asdict(w) for w in ws] for mode, ws in runs.items()},
        }
        if args.json:  # after each length: a run stopped early keeps what it measured
            args.json.write_text(json.dumps(report))
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min), cores: {os.cpu_count()}")


if __name__ == "__main__":
    main()
