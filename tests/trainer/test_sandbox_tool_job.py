"""A multi-turn job whose tool runs in the sandbox, hard-killed mid-run and resumed (issue 30, item 6): Ray, vLLM,
the `python_tool` environment running the model's code blocks in bubblewrap, the LoRA learner, a checkpoint
every step, `tgc train`'s process SIGKILLed during step 3 and resumed in this process. A random tiny model never
writes a code block, so the fixture first teaches it, by a few seconds of supervised steps, to answer the task's
prompt with one; the job samples at its own temperature, and the assertions are on what happened (calls that
ran, their output back as observation tokens, counters that agree), not on the model being right."""

import re
from pathlib import Path

import pytest

from tests.trainer.conftest import TINY_MODEL, kill_trainer_after_checkpoint, read_metrics, tiny_spec
from tests.trainer.test_multi_turn_job import LORA, MULTI_TURN_METRICS, _check_token_exact, _Recorder
from tgc_rl.envs.python_tool import cells_of
from tgc_rl.trainer.main import run
from tgc_rl.trainer.traces import read_page

pytestmark = pytest.mark.slow

# a turn with a closed block runs it and the output comes back as a tool message; the taught model answers that
# with a block too, which is past max_tool_calls and ends the trajectory there, unrun
ENV = {
    "name": "python_tool",
    "params": {"max_output_chars": 200},
    "bounds": {
        "max_turns": 2,
        "max_tool_calls": 1,
        "tool_timeout_s": 10,
        "deadline_s": 120,
        "max_observation_tokens": 32,
        "max_total_tokens": 256,
    },
}
_SUMS = re.compile(r"(?:print\(\d+\+\d+\)\n?)+")  # cells of the taught form, when sampled whole
TEACH_STEPS = 120
TEACH_NEGATIVES = 2048


def _teach(out: Path) -> None:
    """The tests' tiny random model, taught to answer `What is a + b? ...` with
    print(a+b)```python\nprint(b+a)```python\nprint(a+b)``` (no end token: it goes on to the token limit). Each
    of its tokens follows from the token before, which a 2-layer model learns in a few dozen steps; a natural
    ```python ... ``` answer repeats ``` and the newline before different tokens and still missed a third of its
    blocks after 400 steps. Sampled whole, the first turn holds one closed block, print(b+a). AdamW on the CPU;
    the loss is over the assistant tokens, against the rows' tokens and a fresh random sample of the rest of the
    vocabulary (its full logits would be most of the cost)."""
    import math
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from tgc_rl.config import ModelSpec
    from tgc_rl.models import load_tokenizer, model_dir, tokenizer_dir
    from tgc_rl.tasks.arithmetic import ArithmeticParams
    from tgc_rl.tasks.params import fill_template

    spec = ModelSpec.model_validate(TINY_MODEL)
    tok = load_tokenizer(spec)
    model = AutoModelForCausalLM.from_pretrained(model_dir(spec, 0), dtype=torch.float32)

    def render(messages: list[dict[str, str]], generation: bool) -> list[int]:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        return tok.encode(text, add_special_tokens=False)

    rows: list[tuple[list[int], list[int]]] = []
    for a in range(10):
        for b in range(10):
            question = [
                {"role": "user", "content": fill_template(ArithmeticParams().template, a=a, op="+", b=b)}
            ]
            answer = f"print({a}+{b})```python\nprint({b}+{a})```python\nprint({a}+{b})```"
            ids = render([*question, {"role": "assistant", "content": answer}], False)
            start = len(render(question, True))
            end = start + len(tok.encode(answer, add_special_tokens=False))
            assert tok.decode(ids[start:end]) == answer  # the answer's tokens, without the template's close
            rows.append((ids, [-100] * start + ids[start:end] + [-100] * (len(ids) - end)))
    width = max(len(ids) for ids, _ in rows)
    x = torch.tensor([ids + [tok.pad_token_id] * (width - len(ids)) for ids, _ in rows])
    y = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in rows])
    mask = (torch.arange(width)[None] < torch.tensor([len(ids) for ids, _ in rows])[:, None]).long()
    vocab = model.lm_head.weight.shape[0]
    seen = torch.unique(x)  # every token of the rows: always in the softmax
    generator = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * i / TEACH_STEPS)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: a second thread costs more in waits than it saves (2 cores)
    try:
        for _ in range(TEACH_STEPS):
            pick = torch.randperm(len(rows), generator=generator)[:16]
            hidden = model.model(input_ids=x[pick], attention_mask=mask[pick]).last_hidden_state[:, :-1]
            target = y[pick][:, 1:]
            taught = target != -100
            negatives = torch.randint(0, vocab, (TEACH_NEGATIVES,), generator=generator)
            candidates = torch.unique(torch.cat([seen, negatives]))  # sorted
            sampled = ~torch.isin(candidates, seen)
            # each sampled negative stands for (vocab - seen) / sampled tokens of the vocabulary, so the softmax
            # is the full one's estimate: without this the tail of unseen tokens kept most of the mass at T = 1
            stands_for = math.log((vocab - len(seen)) / int(sampled.sum()))
            logits = hidden[taught] @ model.lm_head.weight[candidates].T + sampled * stands_for
            loss = torch.nn.functional.cross_entropy(logits, torch.searchsorted(candidates, target[taught]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            decay.step()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out)
    shutil.copytree(tokenizer_dir(spec), out, dirs_exist_ok=True)


@pytest.fixture(scope="module")
def coder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("coder")
    _teach(out)
    return out


def test_a_sandbox_tool_job_killed_mid_step_resumes_and_trains_the_tool_output_as_observations(
    ray_cluster, coder, tmp_path, monkeypatch
):
    """The killed run leaves no process behind (the helper asserts it); the resume redoes step 3 once, from
    step 2's checkpoint (LoRA adapter, optimizer, data position); every step ran code in the sandbox; step 3,
    resumed in this process, trains the engine's tokens with the sandbox's replies between them."""
    spec = tiny_spec(
        steps=3,
        model={"source": str(coder), "dtype": "float32", "lora": LORA},
        env=ENV,
        **{
            "sampling.max_prompt_tokens": 256,
            "sampling.max_new_tokens": 24,  # room for the taught answer's first closed block
            "resources.rollout_engine": "vllm",
            "checkpoint.every_steps": 1,
            "traces.everything": True,
        },
    )
    run_dir = tmp_path / "run"
    kill_trainer_after_checkpoint(spec, run_dir, "step_2")  # killed during step 3
    killed = read_metrics(run_dir)
    assert [r["step"] for r in killed][:2] == [1, 2]
    assert not (run_dir / "checkpoints" / "step_3").exists()  # the kill came before step 3 ended

    recorder = _Recorder(monkeypatch)
    assert run(spec, run_dir, resume="latest") == "succeeded"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]  # the lost step redone once, none repeated
    assert [r["policy/version"] for r in rows] == [1.0, 2.0, 3.0]
    assert rows[:2] == killed[:2]  # what the checkpoint holds is kept as the killed run logged it
    assert recorder.prompt_indices == [[4, 5]]  # the resume sampled step 3 alone, on the data after step 2
    traces = read_page(run_dir, limit=100).records
    assert sorted((r.step, r.group, r.index) for r in traces) == [
        (s, g, i) for s in (1, 2, 3) for g in range(2) for i in range(4)
    ]

    for r in rows:
        assert all(name in r for name in MULTI_TURN_METRICS), sorted(set(MULTI_TURN_METRICS) - set(r))
        assert r["multi_turn/trajectories"] == 8 and r["multi_turn/dropped_groups"] == 0
        # the sandbox ran code at every step, the output came back, nothing hung
        assert r["multi_turn/tool_calls"] > 0 and r["multi_turn/observation_tokens"] > 0
        assert (
            0 <= r["multi_turn/tool_errors"] <= r["multi_turn/tool_calls"]
            and r["multi_turn/tool_timeouts"] == 0
        )
        # LoRA: every sync checked by the canary, step 3's on the replica the resume's own sync loaded
        assert 0 <= r["sync/canary_logprob_diff"] <= LORA["canary_tolerance"]

    # step 3, resumed here: each trained row is a trajectory whose model turns are what the engine sampled,
    # and whose tool replies are the sandbox's output, carried as observation (mask 0) tokens
    (batch,) = recorder.batches
    assert _check_token_exact(batch, recorder.calls) >= len(batch)
    trajectories = [t for g in recorder.groups for t in g.trajectories]
    rows_trained = {
        tuple(batch.input_ids[i][batch.attention_mask[i].bool()].tolist()) for i in range(len(batch))
    }
    assert {t.token_ids for t in trajectories} == rows_trained
    step3 = rows[2]
    assert sum(t.tool_calls for t in trajectories) == step3["multi_turn/tool_calls"]
    assert sum(t.tool_errors for t in trajectories) == step3["multi_turn/tool_errors"]
    assert sum(t.context_tokens for t in trajectories) == step3["multi_turn/observation_tokens"]
    from tgc_rl.models import load_tokenizer

    tok = load_tokenizer(spec.model)
    taught_cells = 0
    for t in trajectories:
        replies = [(t.messages[i - 1], m) for i, m in enumerate(t.messages) if m.role == "tool"]
        assert len(replies) == t.tool_calls and t.tool_timeouts == 0
        assert all(call.role == "assistant" for call, _ in replies)
        assert sum("Traceback" in reply.content for _, reply in replies) == t.tool_errors
        context = tok.decode(
            [tid for s in t.spans if s.kind == "context" for tid in t.token_ids[s.start : s.end]]
        )
        for call, reply in replies:
            cell = "\n".join(cells_of(call.content))  # what the environment ran
            assert reply.content in context  # the tool's reply was appended as tokens
            if _SUMS.fullmatch(cell):  # of the taught form: its output is each sum, as Python printed it
                sums_of = [int(a) + int(b) for a, b in re.findall(r"(\d+)\+(\d+)", cell)]
                assert reply.content == "".join(f"{n}\n" for n in sums_of)
                taught_cells += 1
    assert taught_cells > 0
