"""Token-exact trajectories: the sequence trained on is the sequence the engine was given and sampled.

Rules (issue 30):
- the model's tokens are kept exactly as sampled, with the engine's log-probs; they are never decoded and
  re-encoded (their text goes to the environment and into the history that the template renders, nowhere
  else);
- an observation is appended as the chat template's token delta: the history rendered without the new
  messages must be a token prefix of the history rendered with them (and the next generation prompt); the
  tokens past that prefix are appended. Where the longer render does not extend the shorter (a template
  that rewrites earlier turns, e.g. Qwen3-style stripping of earlier reasoning), the trajectory fails
  closed with a `BridgeError` (counted as "bridge") rather than train on tokens the model never saw;
- the template's close of an assistant message (e.g. ChatML's `<|im_end|>\\n`) is completed after the
  sampled tokens where the engine stopped short of it (the `\\n` after a sampled `<|im_end|>`, or the whole
  close after a cut-off turn), as context;
- loss mask 1 on model tokens only; prompt, observation and template tokens are 0 and carry no log-prob.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from tgc_rl.envs.base import Message

SpanKind = Literal["prompt", "model", "context"]


class BridgeError(ValueError):
    """The chat template cannot extend this trajectory exactly; the trajectory fails closed ("bridge")."""


class Tokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str: ...


class ChatTemplate:
    """Renders messages to token ids with a tokenizer's chat template (or `chat_template`, a Jinja source).

    The text is rendered first and encoded without added special tokens, as `apply_chat_template` does,
    so the result does not depend on that method's return type across transformers versions.
    """

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template

    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [m.as_dict() for m in messages],
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=self.chat_template,
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def assistant_close(self) -> list[int]:
        """The tokens the template puts after an assistant message's content, found on a probe history:
        render [user, assistant "b"] and take what follows the generation prompt and `b`'s tokens."""
        user = Message("user", "a")
        prompt = self.render([user], add_generation_prompt=True)
        full = self.render([user, Message("assistant", "b")], add_generation_prompt=False)
        body = self.encode("b")
        if full[: len(prompt)] != prompt or full[len(prompt) : len(prompt) + len(body)] != body:
            raise BridgeError(
                "the chat template does not render an assistant message as the generation prompt followed by "
                "its content, so its turns cannot be extended token-exactly"
            )
        return full[len(prompt) + len(body) :]


@dataclass(frozen=True)
class Span:
    kind: SpanKind
    start: int
    end: int


class TrajectoryBuilder:
    """Builds one trajectory's token sequence turn by turn: `start(messages)`, then alternately
    `add_model(...)` with what the engine sampled and `add_observation(messages)`; `prompt_ids()` is what
    the engine is given next."""

    def __init__(self, template: ChatTemplate, close: Sequence[int] | None = None):
        self.template = template
        self.close = list(close) if close is not None else template.assistant_close()
        self.history: list[Message] = []
        self.token_ids: list[int] = []
        self.loss_mask: list[int] = []
        self.logprobs: list[float] = []
        self.spans: list[Span] = []
        self._last_sample: list[int] = []

    def _append(self, kind: SpanKind, ids: Sequence[int], logprobs: Sequence[float] | None = None) -> None:
        if not ids:
            return
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if kind == "model" else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.spans.append(Span(kind, start, len(self.token_ids)))

    def start(self, messages: Sequence[Message]) -> None:
        if self.history:
            raise RuntimeError("TrajectoryBuilder.start: already started")
        if not messages:
            raise ValueError("the first observation (reset) must hold at least one message")
        self.history = list(messages)
        self._append("prompt", self.template.render(self.history, add_generation_prompt=True))

    def prompt_ids(self) -> list[int]:
        return list(self.token_ids)

    def add_model(self, token_ids: Sequence[int], logprobs: Sequence[float], text: str) -> None:
        """One model turn exactly as sampled; `text` is the engine's text for it (for the history only)."""
        if not self.history or self.history[-1].role == "assistant":
            raise RuntimeError("TrajectoryBuilder.add_model: a model turn must follow an observation")
        if len(logprobs) != len(token_ids):
            raise ValueError(f"a model turn of {len(token_ids)} tokens came with {len(logprobs)} log-probs")
        self._append("model", list(token_ids), list(logprobs))
        self.history.append(Message("assistant", text))
        self._last_sample = list(token_ids)

    def observation_delta(self, messages: Sequence[Message]) -> list[int]:
        """The tokens that `add_observation(messages)` would append, or BridgeError."""
        if not self.history or self.history[-1].role != "assistant":
            raise RuntimeError("an observation must follow a model turn")
        shorter = self.template.render(self.history, add_generation_prompt=False)
        longer = self.template.render([*self.history, *messages], add_generation_prompt=True)
        if longer[: len(shorter)] != shorter:
            at = next(
                (i for i, (a, b) in enumerate(zip(shorter, longer, strict=False)) if a != b), len(longer)
            )
            raise BridgeError(
                f"the template's render with the new message(s) does not extend the render without them "
                f"(they differ from token {at} of {len(shorter)}): the template rewrites earlier turns "
                "(e.g. it strips earlier reasoning), so the next prompt would not be what the model saw"
            )
        if self.close and shorter[-len(self.close) :] != self.close:
            raise BridgeError("the template does not end the last assistant message with its usual close")
        # the close after the sampled tokens: the part the engine did not sample (k = the longest prefix of
        # the close that the sample ends with)
        sample = self._last_sample
        k = next(
            (k for k in range(len(self.close), 0, -1) if k <= len(sample) and sample[-k:] == self.close[:k]),
            0,
        )
        return self.close[k:] + longer[len(shorter) :]

    def add_observation(self, messages: Sequence[Message], delta: Sequence[int] | None = None) -> None:
        """Append an observation as its template delta (`delta` from `observation_delta`, or computed)."""
        ids = list(delta) if delta is not None else self.observation_delta(messages)
        self.history.extend(messages)
        self._append("context", ids)

    @property
    def model_tokens(self) -> int:
        return sum(self.loss_mask)
