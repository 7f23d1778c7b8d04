"""One multi-turn trajectory as a state machine the sampler drives, and the record it leaves.

    run = TrajectoryRun(env, ctx, builder, max_new_tokens=256)
    while (request := run.request()) is not None:   # what to give the engine next
        run.feed(engine(request))                   # what it sampled
    trajectory = run.result()

A driver keeps many runs and batches their requests to the engine; each run advances on its own, so a
slow trajectory does not hold the others. Every bound ends the run with a recorded `end_reason`; an
environment that raises ends it with `env_error`; a template that cannot extend it with `bridge`.
The trainer's driver is tgc_rl/trainer/multi_turn.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tgc_rl.envs.base import BoundHit, EndReason, EnvContext, Environment, Message
from tgc_rl.envs.tokens import BridgeError, Span, TrajectoryBuilder

if TYPE_CHECKING:
    from tgc_rl.batch import Completion

TRUNCATION_MARKER = "\n...[truncated {n} tokens]"


@dataclass(frozen=True)
class GenerateRequest:
    """Give the engine exactly `prompt_ids` and sample at most `max_tokens`."""

    prompt_ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True)
class Sample:
    """What the engine sampled for a request: token ids, their log-probs, and its text for them."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    finish_reason: str = "stop"


@dataclass(frozen=True)
class Trajectory:
    """One trajectory to train on: `token_ids` is what the engine was given and sampled, token for token;
    `loss_mask` is 1 exactly on model tokens, where `logprobs` holds the engine's log-probs (0.0 elsewhere)."""

    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    spans: tuple[Span, ...]
    prompt_len: int  # tokens of the first prompt
    reward: float  # the sum of the steps' rewards: one number per trajectory
    end_reason: EndReason
    detail: str
    turns: int
    tool_calls: int
    tool_errors: int
    tool_timeouts: int
    observation_truncations: int
    messages: tuple[Message, ...]  # the history as the template rendered it (for traces)

    @property
    def model_tokens(self) -> int:
        return sum(self.loss_mask)

    def completion(self, version: int) -> Completion:
        """The trajectory after its first prompt as the learner's response (tgc_rl.batch): its model and
        context spans as segments, the end reason as its finish reason."""
        from tgc_rl.batch import Completion, Segment

        segments = [
            Segment(
                list(self.token_ids[s.start : s.end]),
                list(self.logprobs[s.start : s.end]) if s.kind == "model" else None,
            )
            for s in self.spans
            if s.kind != "prompt"
        ]
        return Completion.from_segments(segments, self.end_reason, version)

    @property
    def context_tokens(self) -> int:
        """Observation and template tokens after the first prompt."""
        return len(self.token_ids) - self.prompt_len - self.model_tokens


class TrajectoryRun:
    def __init__(self, env: Environment, ctx: EnvContext, builder: TrajectoryBuilder, max_new_tokens: int):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: must be at least 1")
        self.env, self.ctx, self.builder, self.max_new_tokens = env, ctx, builder, max_new_tokens
        self.bounds = ctx.bounds
        self.turns = self.tool_errors = self.tool_timeouts = self.truncations = 0
        self.reward = 0.0
        self.end_reason: EndReason | None = None
        self.detail = ""
        self._waiting = False
        try:
            first = list(env.reset())
            if first and first[-1].role == "assistant":
                raise ValueError("the first observation ends with an assistant message; the model answers it")
            builder.start(first)
        except BridgeError as e:
            self._end("bridge", str(e))
        except Exception as e:  # an environment's failure is this trajectory's, not the job's
            self._end("env_error", f"reset: {type(e).__name__}: {e}")
        else:
            if len(builder.token_ids) >= self.bounds.max_total_tokens:
                self._end("max_total_tokens", f"the first prompt has {len(builder.token_ids)} tokens")

    @property
    def ended(self) -> bool:
        return self.end_reason is not None

    def _end(self, reason: EndReason, detail: str = "") -> None:
        if self.end_reason is None:
            self.end_reason, self.detail = reason, detail
            try:
                self.env.close()
            except Exception as e:  # closing must not hide why the run ended
                self.detail += f" (close failed: {type(e).__name__}: {e})"

    def request(self) -> GenerateRequest | None:
        """The next generation request, or None once the run has ended."""
        if self.ended:
            return None
        if self._waiting:
            raise RuntimeError("TrajectoryRun.request: the previous request has not been fed")
        room = self.bounds.max_total_tokens - len(self.builder.token_ids)
        if room <= 0:
            self._end("max_total_tokens", f"{len(self.builder.token_ids)} tokens")
            return None
        if self.ctx.time_left() <= 0:
            self._end("deadline", f"before turn {self.turns + 1} ({self.bounds.deadline_s} s)")
            return None
        self._waiting = True
        return GenerateRequest(tuple(self.builder.prompt_ids()), min(self.max_new_tokens, room))

    def feed(self, sample: Sample) -> None:
        """Record one sampled turn and step the environment with its text."""
        if not self._waiting:
            raise RuntimeError("TrajectoryRun.feed: no request is waiting for a sample")
        self._waiting = False
        self.builder.add_model(sample.token_ids, sample.logprobs, sample.text)
        self.turns += 1
        if self.ctx.time_left() <= 0:
            self._end("deadline", f"during turn {self.turns} ({self.bounds.deadline_s} s)")
            return
        try:
            result = self.env.step(sample.text)
        except BoundHit as e:
            self._end(e.reason, e.detail)
            return
        except Exception as e:
            self._end("env_error", f"step {self.turns}: {type(e).__name__}: {e}")
            return
        self.reward += result.reward
        self.tool_errors += result.info.tool_errors
        self.tool_timeouts += result.info.tool_timeouts
        if result.done:
            self._end("done", result.info.detail)
            return
        if self.turns >= self.bounds.max_turns:
            self._end("max_turns", f"{self.turns} turns")
            return
        if self.ctx.time_left() <= 0:
            self._end("deadline", f"after turn {self.turns} ({self.bounds.deadline_s} s)")
            return
        assert result.observation is not None  # StepResult checks it for a step not done
        messages = self._bounded(result.observation)
        try:
            delta = self.builder.observation_delta(messages)
        except BridgeError as e:
            self._end("bridge", str(e))
            return
        if len(self.builder.token_ids) + len(delta) >= self.bounds.max_total_tokens:
            self._end("max_total_tokens", f"observation after turn {self.turns} would pass the bound")
            return
        self.builder.add_observation(messages, delta)

    def _bounded(self, messages: Sequence[Message]) -> list[Message]:
        """The observation with its content cut to max_observation_tokens (in message order), marked."""
        left = self.bounds.max_observation_tokens
        out = []
        template = self.builder.template
        for m in messages:
            ids = template.encode(m.content)
            if len(ids) <= left:
                out.append(m)
                left -= len(ids)
                continue
            self.truncations += 1
            cut = template.decode(ids[:left]) if left > 0 else ""
            out.append(Message(m.role, cut + TRUNCATION_MARKER.format(n=len(ids) - left)))
            left = 0
        return out

    def result(self) -> Trajectory:
        if not self.ended:
            raise RuntimeError("TrajectoryRun.result: the run has not ended")
        b = self.builder
        assert self.end_reason is not None
        return Trajectory(
            token_ids=tuple(b.token_ids),
            loss_mask=tuple(b.loss_mask),
            logprobs=tuple(b.logprobs),
            spans=tuple(b.spans),
            prompt_len=b.spans[0].end if b.spans else 0,
            reward=self.reward,
            end_reason=self.end_reason,
            detail=self.detail,
            turns=self.turns,
            tool_calls=self.ctx.tool_calls,
            tool_errors=self.tool_errors,
            tool_timeouts=self.tool_timeouts,
            observation_truncations=self.truncations,
            messages=tuple(b.history),
        )
