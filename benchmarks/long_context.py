"""Peak memory and time of one learner step at reasoning lengths (issue 33 item 2), each point in a fresh process.

One group of 8 responses of R tokens (prompt 256, responses distinct from their first token: the tree shares
the prompt only) is one micro-batch of one optimizer step, with activation checkpointing and chunked
log-probs (1024 tokens a chunk) on a 152k vocabulary, for:

  plain  the plain torch loop: the HF model unwrapped, one forward per row (8 x (256 + R) tokens, SDPA with
         the padding mask), the same chunked head and rlcore loss, AdamW (benchmarks/learner.py's loop)
  dense  tgc_rl.learner.Learner (FSDP2, world size 1) with the shared-prompt forward on the dense L x L tree
         mask (optim.dense_tree_max_tokens above L), L = 256 + 8R nodes
  block  the same learner on the block tree kernel (optim.dense_tree_max_tokens 0)

The loss mask covers every --loss-every-th response token (default 16): the head's memory is bounded by its
chunk (1024 x 152k floats) whatever the count, but its time is not: with every token, one 4096 point runs the
head over 32k tokens x 152k (10 TFLOP of forward, recompute and two gradients: a quarter of an hour on this
loaded 2-core machine). The decoder and its attention still run over every token.

Each point runs in its own process: the peak resident set of the step is read from the kernel's high-water
mark (VmHWM, reset after the model, optimizer state and batch are built: /proc/self/clear_refs), so one
variant's allocations cannot hide in another's. The parent samples each child's RSS and kills it above
--cap-gb (this machine is shared): such a point is reported as "> cap".

    .venv/bin/python benchmarks/long_context.py --lock /tmp/tgc-heavy.lock   # 256, 1024, 4096, a lock per point
    .venv/bin/python benchmarks/long_context.py --responses 64 --variants plain block  # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

import torch

VARIANTS = ("plain", "dense", "block")
SHAPE = {  # a small decoder on Qwen2's 152k vocabulary: the head and the attention dominate, as at length
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
}
GROUP = 8
CHUNK = 1024


@dataclass
class Point:
    variant: str
    response: int
    nodes: int  # tokens the decoder computes: rows' tokens (plain) or the tree's nodes
    base_mb: float  # RSS with model, optimizer state and batch built, before the step
    peak_mb: float  # high-water RSS during the step
    step_s: float
    attention: str  # what the tree forward ran: dense / block (plain: rows)


def _rss_mb(field: str = "VmRSS", pid: str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def _model_spec():
    from tgc_rl.config import ModelSpec

    return ModelSpec(source="random", dtype="float32", config_overrides=SHAPE)


def _batch(prompt: int, response: int, loss_every: int):
    import rlcore
    from tgc_rl.batch import Completion, collate

    gen = torch.Generator().manual_seed(0)
    p = torch.randint(3, SHAPE["vocab_size"], (prompt,), generator=gen).tolist()
    comps = []
    for i in range(GROUP):
        toks = torch.randint(3, SHAPE["vocab_size"], (response,), generator=gen)
        toks[0] = 3 + i  # distinct first tokens: nothing but the prompt is shared
        comps.append(Completion(toks.tolist(), [-1.0] * response, "stop", 0))
    r = torch.tensor([float(i % 2) for i in range(GROUP)])
    batch = collate([p] * GROUP, comps, [0] * GROUP, r, pad_id=2)
    keep = torch.zeros_like(batch.response_mask)
    keep[:, loss_every - 1 :: loss_every] = 1  # the head's work (see the module docstring)
    batch = dataclasses.replace(batch, response_mask=batch.response_mask * keep)
    return batch.with_advantages(
        rlcore.get_objective("cp_grpo").advantages(r, batch.group_ids, batch.response_mask)
    )


def _learner(variant: str, response: int):
    from tgc_rl.config import JobSpec
    from tgc_rl.learner import Learner, LearnerSpec
    from tgc_rl.models import model_dir

    spec = JobSpec.parse(
        {
            "name": "bench-long",
            "model": _model_spec().model_dump(),
            "objective": {"name": "cp_grpo"},
            "group_size": GROUP,
            "prompts_per_step": 1,
            "steps": 10,
            "sampling": {"max_new_tokens": response, "max_prompt_tokens": 256},
            "optim": {
                "lr": 1e-6,
                "micro_batch_size": GROUP,
                "logprob_chunk_tokens": CHUNK,
                "activation_checkpointing": True,
                "dense_tree_max_tokens": 0 if variant == "block" else 1_048_576,
            },
            "resources": {"cpus_per_learner": 1},
        }
    )
    return Learner(LearnerSpec.of(spec), model_dir(_model_spec()))


def run_point(variant: str, response: int, prompt: int, threads: int, loss_every: int) -> Point:
    """In the child: build, reset the high-water mark, one step, read it."""
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    batch = _batch(prompt, response, loss_every)
    if variant == "plain":
        from transformers import AutoModelForCausalLM

        import rlcore
        from benchmarks.learner import plain_loop_step
        from tgc_rl.learner.logprobs import PolicyLogprobs
        from tgc_rl.models import model_dir

        lm = AutoModelForCausalLM.from_pretrained(model_dir(_model_spec()), dtype=torch.float32)
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy = PolicyLogprobs(lm, CHUNK)
        policy.train()
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6, fused=True)
        objective = rlcore.get_objective("cp_grpo")

        def step():
            plain_loop_step(
                policy, optimizer, objective, batch, [list(range(GROUP))], response, torch.float32
            )

        nodes, attention = int(batch.attention_mask.sum()), "rows"
    else:
        learner = _learner(variant, response)
        step = lambda: learner.train_step(batch)  # noqa: E731
        nodes, attention = prompt + GROUP * response, ""
    base = _rss_mb()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    t0 = time.perf_counter()
    step()
    step_s = time.perf_counter() - t0
    peak = _rss_mb("VmHWM")
    if variant != "plain":
        attention = learner.policy.last_tree_attention or "rows"
    return Point(variant, response, nodes, round(base, 1), round(peak, 1), round(step_s, 2), attention)


def measure(variant: str, response: int, args) -> Point | str:
    """One point in a fresh process; the parent kills it above the RSS cap."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        variant,
        str(response),
        "--prompt",
        str(args.prompt),
    ]
    cmd += ["--threads", str(args.threads), "--loss-every", str(args.loss_every)]
    lock = open(args.lock, "a") if args.lock else None  # noqa: SIM115 (held for the point, released below)
    if lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one heavy run at a time on a shared machine, others between points
    try:
        return _watch(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True), args.cap_gb)
    finally:
        if lock:
            lock.close()


def _watch(proc: subprocess.Popen, cap_gb: float) -> Point | str:
    seen = 0.0
    while proc.poll() is None:
        try:
            seen = max(seen, _rss_mb(pid=str(proc.pid)))
        except (OSError, RuntimeError):
            pass
        if seen > cap_gb * 1024:
            proc.kill()
            proc.wait()
            return f"> {cap_gb} GB (killed)"
        time.sleep(0.05)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        return f"failed (exit {proc.returncode})"
    return Point(**json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--responses", type=int, nargs="+", default=[256, 1024, 4096])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--loss-every", type=int, default=16, help="loss on every k-th response token")
    ap.add_argument("--cap-gb", type=float, default=10.0)
    ap.add_argument("--json", help="also write the points here")
    ap.add_argument("--lock", help="hold this flock(1) file during each point")
    ap.add_argument(
        "--png", help="plot peak RSS and step time vs response length here (from --plot-json or this run)"
    )
    ap.add_argument("--plot-json", help="plot these saved points instead of measuring")
    ap.add_argument("--child", nargs=2, metavar=("VARIANT", "RESPONSE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plot_json:
        with open(args.plot_json) as f:
            plot(json.load(f), args.png or "long_context.png")
        return
    if args.child:
        import logging

        logging.disable(logging.WARNING)
        p = run_point(args.child[0], int(args.child[1]), args.prompt, args.threads, args.loss_every)
        print(json.dumps(asdict(p)))
        return
    from tgc_rl.config import cpu_model

    print(
        f"# {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, {platform.python_version()}, "
        f"{args.threads} thread(s); prompt {args.prompt}, group {GROUP}, micro-batch {GROUP} rows, "
        f"chunk {CHUNK}, activation checkpointing, vocab {SHAPE['vocab_size']}, loss on every "
        f"{args.loss_every}th response token"
    )
    print(
        f"{'response':>8} {'variant':>7} {'attention':>9} {'nodes':>7} {'base MB':>8} {'peak MB':>8} "
        f"{'step MB':>8} {'step s':>7}"
    )
    points = []
    for r in args.responses:
        for v in args.variants:
            p = measure(v, r, args)
            if isinstance(p, str):
                print(f"{r:>8} {v:>7} {p}", flush=True)
                continue
            points.append(asdict(p))
            print(
                f"{r:>8} {v:>7} {p.attention:>9} {p.nodes:>7} {p.base_mb:>8.0f} {p.peak_mb:>8.0f} "
                f"{p.peak_mb - p.base_mb:>8.0f} {p.step_s:>7.1f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(points, f, indent=1)
    if args.png:
        plot(points, args.png)


def plot(points: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_m, ax_t) = plt.subplots(1, 2, figsize=(10, 4))
    for v in VARIANTS:
        pts = sorted((p for p in points if p["variant"] == v), key=lambda p: p["response"])
        if pts:
            x = [p["response"] for p in pts]
            ax_m.plot(x, [p["peak_mb"] / 1024 for p in pts], "o-", label=v)
            ax_t.plot(x, [p["step_s"] for p in pts], "o-", label=v)
    for ax, label in ((ax_m, "peak RSS of the step (GB)"), (ax_t, "step time (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("response tokens (prompt 256, group 8, one micro-batch)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("One learner step, vocab 152k, activation checkpointing, chunked log-probs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
