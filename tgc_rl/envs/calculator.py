"""The `calculator` environment: the model may call an arithmetic tool, `<calc>EXPRESSION</calc>`.

Expressions are parsed by a small recursive-descent parser over exact rationals (never Python `eval`):
integers and decimals, + - * / ^ (or **), unary minus, parentheses. Input size, nesting depth, exponent
size and the size of every intermediate result are bounded, so a call costs microseconds to milliseconds
whatever the model writes. A turn with calls gets one tool message with a line per call; a turn without
a call is the final answer, scored by the task's verifier. `tool: false` is the same environment without the
tool (the baseline a tool is measured against): examples are played as question and answer, and every model
turn is the final answer.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tgc_rl.envs.base import EnvContext, Message, StepInfo, StepResult

_CALL = re.compile(r"<calc>(.*?)</calc>", re.S)
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?|\.\d+)|(\*\*|[-+*/^()]))")


class CalcError(ValueError):
    """The expression is not one the calculator evaluates; the message says why (the model sees it)."""


class WorkedExample(BaseModel):
    """A few-shot example played as real chat turns before the question: the user asks, the model calls the
    calculator, the tool answers (computed here, as in a trajectory), the model answers."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    question: str = Field(..., min_length=1, max_length=2048)
    expression: str = Field(..., min_length=1, max_length=200)
    answer: str = Field(..., min_length=1, max_length=2048)


class CalculatorParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max_expression_chars: int = Field(200, ge=1, le=4096, description="Longest expression evaluated.")
    max_exponent: int = Field(64, ge=1, le=4096, description="Largest |exponent| of ^.")
    max_digits: int = Field(200, ge=1, le=10000, description="Largest number of digits of any result.")
    system_prompt: str | None = Field(
        None, max_length=8192, description="A system message placed before the task's prompt."
    )
    examples: list[WorkedExample] = Field(
        [], max_length=4, description="Worked examples played as chat turns before the question."
    )
    tool: bool = Field(
        True,
        description="Offer the calculator. false: the same job without it, to measure what the tool adds: "
        "each example is played as its question and answer only (no call, no result), and every model turn "
        "is the final answer (a <calc> in it is not run); the system prompt must not mention <calc>.",
    )

    @model_validator(mode="after")
    def _examples_evaluate(self) -> CalculatorParams:
        for i, example in enumerate(self.examples):
            try:
                evaluate(example.expression, self)
            except CalcError as e:
                raise ValueError(f"examples[{i}].expression {example.expression!r}: {e}") from None
        if not self.tool and self.system_prompt and "<calc>" in self.system_prompt:
            # the tools-off baseline must not describe the tool it does not run
            raise ValueError(
                "system_prompt describes the calculator (<calc>) but tool is false: drop the system prompt "
                "or write one without the tool"
            )
        return self


class _Parser:
    """expr := term (('+'|'-') term)*; term := unary (('*'|'/') unary)*; unary := '-' unary | power;
    power := atom (('^'|'**') unary)?; atom := number | '(' expr ')'."""

    def __init__(self, text: str, params: CalculatorParams):
        self.params = params
        self.tokens: list[str] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise CalcError(f"unexpected {text[pos : pos + 10]!r} at character {pos}")
            self.tokens.append(m.group(1) or m.group(2))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.i = 0
        self.depth = 0

    def parse(self) -> Fraction:
        if not self.tokens:
            raise CalcError("empty expression")
        value = self._expr()
        if self.i != len(self.tokens):
            raise CalcError(f"unexpected {self.tokens[self.i]!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _next(self) -> str:
        tok = self._peek()
        if tok is None:
            raise CalcError("the expression ends too early")
        self.i += 1
        return tok

    def _check(self, value: Fraction) -> Fraction:
        digits = max(len(str(abs(value.numerator))), len(str(value.denominator)))
        if digits > self.params.max_digits:
            raise CalcError(f"a result has more than {self.params.max_digits} digits")
        return value

    def _expr(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            op, right = self._next(), self._term()
            value = self._check(value + right if op == "+" else value - right)
        return value

    def _term(self) -> Fraction:
        value = self._unary()
        while self._peek() in ("*", "/"):
            op, right = self._next(), self._unary()
            if op == "/" and right == 0:
                raise CalcError("division by zero")
            value = self._check(value * right if op == "*" else value / right)
        return value

    def _unary(self) -> Fraction:
        if self._peek() == "-":
            self._next()
            return -self._nested(self._unary)
        return self._power()

    def _power(self) -> Fraction:
        base = self._atom()
        if self._peek() in ("^", "**"):
            self._next()
            exponent = self._nested(self._unary)
            if exponent.denominator != 1:
                raise CalcError("only whole exponents are supported")
            e = int(exponent)
            if abs(e) > self.params.max_exponent:
                raise CalcError(f"exponent {e} is beyond +-{self.params.max_exponent}")
            if base == 0 and e < 0:
                raise CalcError("division by zero")
            # bound the size before computing: digits(base^e) <= |e| * digits(base)
            size = max(len(str(abs(base.numerator))), len(str(base.denominator)))
            if abs(e) * size > self.params.max_digits + abs(e):
                raise CalcError(f"a result has more than {self.params.max_digits} digits")
            return self._check(base**e)
        return base

    def _atom(self) -> Fraction:
        tok = self._next()
        if tok == "(":
            value = self._nested(self._expr)
            if self._peek() != ")":
                raise CalcError("a '(' is not closed")
            self._next()
            return value
        if tok[0].isdigit() or tok[0] == ".":
            if len(tok) > self.params.max_digits:
                raise CalcError(f"a number has more than {self.params.max_digits} digits")
            return Fraction(tok)
        raise CalcError(f"unexpected {tok!r}")

    def _nested(self, rule: Any) -> Fraction:
        self.depth += 1
        if self.depth > 64:
            raise CalcError("the expression is nested too deeply")
        try:
            return rule()
        finally:
            self.depth -= 1


def evaluate(expression: str, params: CalculatorParams | None = None) -> str:
    """The value of `expression` as text: an integer, else a decimal rounded to 12 places."""
    params = params or CalculatorParams()
    if len(expression) > params.max_expression_chars:
        raise CalcError(f"the expression is longer than {params.max_expression_chars} characters")
    value = _Parser(expression, params).parse()
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    scaled = round(abs(value) * 10**12)
    whole, frac = divmod(scaled, 10**12)
    return f"{sign}{whole}.{frac:012d}".rstrip("0").rstrip(".")


def _result_line(expression: str, params: CalculatorParams) -> tuple[str, bool]:
    """What the tool says for one call, and whether it evaluated."""
    try:
        return f"{expression.strip()} = {evaluate(expression, params)}", True
    except CalcError as e:
        return f"{expression.strip()[:80]}: error: {e}", False


class CalculatorEnv:
    def __init__(self, ctx: EnvContext, params: CalculatorParams):
        self.ctx, self.params = ctx, params

    def reset(self) -> list[Message]:
        out = [Message("system", self.params.system_prompt)] if self.params.system_prompt else []
        for example in self.params.examples:
            out.append(Message("user", example.question))
            if self.params.tool:
                out += [
                    Message("assistant", f"<calc>{example.expression}</calc>"),
                    Message("tool", _result_line(example.expression, self.params)[0]),
                ]
            out.append(Message("assistant", example.answer))
        return [*out, Message("user", self.ctx.item.prompt)]

    def step(self, model_text: str) -> StepResult:
        calls = _CALL.findall(model_text) if self.params.tool else []
        if not calls:
            score = self.ctx.verify(model_text)
            return StepResult(None, score.reward, True, StepInfo(detail=score.detail))
        lines, errors = [], 0
        for expression in calls:
            self.ctx.start_tool_call()  # counts the call; raises at max_tool_calls or the deadline
            line, ok = _result_line(expression, self.params)
            lines.append(line)
            errors += not ok
        return StepResult((Message("tool", "\n".join(lines)),), info=StepInfo(tool_errors=errors))

    def close(self) -> None:
        pass
