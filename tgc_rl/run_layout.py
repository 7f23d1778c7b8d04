"""The contract between a run and whoever reads it back (the control plane, the CLI, the dashboards): the
files of a run directory, checkpoint names, job states, trainer events and metric names.

One home for each, importable without torch or Ray: the trainer writes through these names and types, the
control plane and the tools read through the same ones, so a rename is one edit here.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, TypeAdapter, ValidationError, field_validator

# -- the files of a run directory -----------------------------------------------------------------
SPEC_FILE = "spec.yaml"  # the job spec the run was started with
EVENTS_FILE = "events.jsonl"  # trainer events, one JSON object a line (the events below)
METRICS_FILE = "metrics.jsonl"  # one row of step metrics a line: {"step": N, name: value, ...}
CANCEL_FILE = "CANCEL"  # present: stop at the next step boundary (its text is the reason)
CURVES_FILE = "curves.png"
CHECKPOINTS_DIR = "checkpoints"  # <run dir>/checkpoints/step_N
TRAINER_STATE_FILE = "trainer_state.json"  # inside a checkpoint; written last, so its presence = complete
LOGS_DIR = "logs"  # actors' and engines' logs, copied at the end of a run
TENSORBOARD_DIR = "tensorboard"

_CHECKPOINT = re.compile(r"step_(\d+)", re.ASCII)


def checkpoint_name(step: int) -> str:
    return f"step_{step}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint directory name (`step_N`), else None."""
    m = _CHECKPOINT.fullmatch(name)
    return int(m.group(1)) if m else None


# -- job states -----------------------------------------------------------------------------------
class JobState(StrEnum):
    """A job's lifecycle (transitions: tgc_rl/control/states.py)."""

    QUEUED = "queued"  # accepted, waiting for its tenant's quota
    STARTING = "starting"  # submitted to Ray; the trainer has not reported yet
    RUNNING = "running"  # the trainer reported that it runs
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


# The states a trainer may report; the others are the control plane's own.
TRAINER_STATES = frozenset({JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
# A run that ended this way did what was asked (a cancel is the user's choice): exit status 0.
ENDED_OK = frozenset({JobState.SUCCEEDED, JobState.CANCELLED})


# -- metric names ---------------------------------------------------------------------------------
# Per-step metrics that something outside the trainer reads by name (console, curves, summary, CLI,
# dashboard, alerts). Emitters elsewhere (rlcore, the learner) may still spell them out; these are the names.
REWARD_MEAN = "reward/mean"
REWARD_ACCURACY = "reward/accuracy"
REWARD_TIMEOUTS = "reward/timeouts"
REWARD_ERRORS = "reward/errors"
EVAL_ACCURACY = "eval/accuracy"
D1_GCPR = "diag/d1_gcpr"
D2_RESIDUAL = "diag/d2_residual"
D4_GROUPS_COMPLETE = "diag/d4_groups_complete_frac"
ENTROPY = "entropy"
D7_ENTROPY_MEAN = "diag/d7_entropy_mean"
D7_ENTROPY_SHARED = "diag/d7_entropy_shared"
D7_ENTROPY_FORK = "diag/d7_entropy_fork"
RESPONSE_LENGTH_MEAN = "response/length_mean"
RESPONSE_TOKENS = "response/tokens"
THROUGHPUT_TOKENS_PER_S = "throughput/tokens_per_s"
TIMING_GENERATE = "timing/generate_s"
TIMING_REWARD = "timing/reward_s"
TIMING_PREPARE = "timing/prepare_s"
TIMING_TRAIN = "timing/train_s"
TIMING_SYNC = "timing/sync_s"
TIMING_STEP = "timing/step_s"
ROLLOUT_SYNC = "rollout/sync_s"
ROLLOUT_INFORMATIVE_GROUPS = "rollout/informative_groups"
PRESERVES_CANCELLATION = "objective/preserves_cancellation"
# Off-policy (docs/objectives.md#behaviour-policy-corrections): the learner's k3 KL to the sampling engine, the
# spread of the engine's log-probs across copies of shared tokens (the token-level corrections' cancellation
# condition), the share of tokens the behaviour correction truncated or masked, its mean weight, the policy lag,
# how many shared-token pairs the spread was measured on, and the queued rollouts dropped as too stale.
MISMATCH_K3 = "mismatch/k3_kl"
MISMATCH_SPREAD_MEAN = "mismatch/shared_spread_mean"
MISMATCH_SPREAD_MAX = "mismatch/shared_spread_max"
BEHAVIOUR_CORRECTED_FRAC = "objective/behaviour/corrected_frac"
POLICY_STALENESS_MAX = "policy/staleness_max"
MISMATCH_SHARED_PAIRS = "mismatch/shared_pairs"
BEHAVIOUR_COEF_MEAN = "objective/behaviour/coef_mean"
ROLLOUT_STALE_DROPPED = "rollout/stale_dropped"
# k_step's `async.steps_per_call`: the steps sampled by the step's engine call; the step's timings and rollout
# counters are its equal share of that call's
ROLLOUT_STEPS_PER_CALL = "rollout/steps_per_call"
# Multi-turn jobs (`env:`, docs/multi_turn.md): per step, summed over the step's trajectories (refills
# included); bound hits per reason as `multi_turn/bound_hits/<reason>`.
MT_TRAJECTORIES = "multi_turn/trajectories"
MT_TURNS = "multi_turn/turns"
MT_TURNS_PER_TRAJECTORY = "multi_turn/turns_per_trajectory"
MT_TOOL_CALLS = "multi_turn/tool_calls"
MT_TOOL_ERRORS = "multi_turn/tool_errors"
MT_TOOL_TIMEOUTS = "multi_turn/tool_timeouts"
MT_OBSERVATION_TOKENS = "multi_turn/observation_tokens"
MT_MODEL_TOKENS = "multi_turn/model_tokens"
MT_BOUND_HITS = "multi_turn/bound_hits"
MT_BRIDGE_FAILURES = "multi_turn/bridge_failures"
MT_DROPPED_TRAJECTORIES = "multi_turn/dropped_trajectories"
MT_DROPPED_GROUPS = "multi_turn/dropped_groups"
TIMING_ENV = "timing/env_s"
# the bounds whose hits are counted, each as `multi_turn/bound_hits/<reason>`
MT_BOUND_REASONS = ("max_turns", "max_tool_calls", "deadline", "max_total_tokens")
# the step's counters, summed over its trajectories (the per-trajectory mean is MT_TURNS_PER_TRAJECTORY)
MT_STEP_COUNTERS = (
    MT_TRAJECTORIES,
    MT_TURNS,
    MT_TOOL_CALLS,
    MT_TOOL_ERRORS,
    MT_TOOL_TIMEOUTS,
    MT_OBSERVATION_TOKENS,
    MT_MODEL_TOKENS,
    MT_BRIDGE_FAILURES,
    MT_DROPPED_TRAJECTORIES,
    MT_DROPPED_GROUPS,
    *(f"{MT_BOUND_HITS}/{reason}" for reason in MT_BOUND_REASONS),
)
# sampling.overlong (docs/objectives.md#overlong-responses), per step when on: the share of responses shaped
# (penalised) or filtered (truncated), and the groups left with < 2 kept responses (advantage 0, no gradient).
OVERLONG_FRAC = "overlong/frac"
OVERLONG_DROPPED_GROUPS = "overlong/dropped_groups"

# Prometheus series of a running job (Ray's exporter prefixes `ray_`): its last step, and each step metric
# with the metric's name as the `metric` label.
STEP_GAUGE = "tgc_train_step"
METRIC_GAUGE = "tgc_train_metric"


@dataclass(frozen=True)
class Headline:
    name: str  # the key in a step's metrics
    short: str  # in the one-line-per-step console output
    label: str  # in sentences and legends
    panel: str  # the curves.png panel that draws it (metrics of one panel share a scale)


# The headline metrics, in order: the console's step line, the run summary, `curves.png`'s panels and the
# CLI's metric columns (`tgc status`, `tgc metrics`, a followed job) all show these, and these first.
HEADLINE_METRICS: tuple[Headline, ...] = (
    Headline(REWARD_MEAN, "reward", "train reward", "reward"),
    Headline(REWARD_ACCURACY, "acc", "train accuracy", "reward"),
    Headline(D1_GCPR, "D1", "D1 (group-common prefix)", "cancellation residual"),
    Headline(D2_RESIDUAL, "D2", "D2 (shared nodes)", "cancellation residual"),
    Headline(RESPONSE_LENGTH_MEAN, "len", "response length (tokens)", "response length"),
    Headline(EVAL_ACCURACY, "eval acc", "held-out accuracy", "reward"),
    Headline(TIMING_STEP, "s/step", "seconds per step", "seconds per step"),
)


# The curves of a run, top to bottom, as `curves.png` and the browser console draw them: (panel title,
# [(metric, label)]): each headline metric in its panel, then token entropy, then the step time at the bottom.
def _curve_panels() -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    grouped: dict[str, list[tuple[str, str]]] = {}
    for h in HEADLINE_METRICS:
        grouped.setdefault(h.panel, []).append((h.name, h.label))
    last = grouped.pop("seconds per step", [])
    entropy = [
        (D7_ENTROPY_MEAN, "all tokens"),
        (D7_ENTROPY_SHARED, "shared tokens"),
        (D7_ENTROPY_FORK, "forks"),
    ]
    panels = [*grouped.items(), ("token entropy", entropy), *([("seconds per step", last)] if last else [])]
    return tuple((title, tuple(series)) for title, series in panels)


CURVE_PANELS = _curve_panels()

# Every per-step metric name a dashboard query or an alert rule may read (tests/ops check them against this).
WATCHED_METRICS = frozenset(
    {
        REWARD_MEAN,
        REWARD_ACCURACY,
        REWARD_TIMEOUTS,
        REWARD_ERRORS,
        EVAL_ACCURACY,
        D1_GCPR,
        D2_RESIDUAL,
        D4_GROUPS_COMPLETE,
        ENTROPY,
        D7_ENTROPY_MEAN,
        D7_ENTROPY_SHARED,
        D7_ENTROPY_FORK,
        RESPONSE_LENGTH_MEAN,
        THROUGHPUT_TOKENS_PER_S,
        TIMING_GENERATE,
        TIMING_REWARD,
        TIMING_PREPARE,
        TIMING_TRAIN,
        TIMING_SYNC,
        TIMING_STEP,
        ROLLOUT_SYNC,
        ROLLOUT_INFORMATIVE_GROUPS,
        PRESERVES_CANCELLATION,
        MISMATCH_K3,
        MISMATCH_SPREAD_MEAN,
        MISMATCH_SPREAD_MAX,
        BEHAVIOUR_CORRECTED_FRAC,
        POLICY_STALENESS_MAX,
        MISMATCH_SHARED_PAIRS,
        BEHAVIOUR_COEF_MEAN,
        ROLLOUT_STALE_DROPPED,
        *MT_STEP_COUNTERS,
        MT_TURNS_PER_TRAJECTORY,
        TIMING_ENV,
        OVERLONG_FRAC,
        OVERLONG_DROPPED_GROUPS,
    }
)


# -- trainer events -------------------------------------------------------------------------------
# What the trainer appends to events.jsonl and POSTs to the control plane: the same objects, one union.
MAX_LOG_MESSAGE = 8192
MAX_METRICS_PER_STEP = 512

_Step = Annotated[int, Strict(), Field(ge=0, le=2**31 - 1)]  # the store keeps steps as 32-bit integers
_Time = Annotated[float, Field(allow_inf_nan=False, description="unix seconds")]


class EventError(ValueError):
    """A malformed trainer event; the message names the field (`events[i].field: ...`)."""


class _Event(BaseModel):
    # Fields a newer trainer adds are dropped, not refused: one unknown field must not block a whole batch.
    model_config = ConfigDict(extra="ignore", frozen=True)

    time: _Time
    source: Literal["trainer"] = "trainer"  # the control plane's own transitions are stored as source=control

    @field_validator("time", mode="before")
    @classmethod
    def _no_bool_time(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("must be a finite number (unix seconds)")
        return v

    def wire(self) -> dict[str, Any]:
        """The event as plain JSON: what events.jsonl holds and what is POSTed and stored."""
        return json_safe(self.model_dump(mode="json"))


class StateEvent(_Event):
    type: Literal["state"] = "state"
    state: JobState
    reason: str = ""
    step: _Step | None = None

    @field_validator("state")
    @classmethod
    def _trainer_state(cls, v: JobState) -> JobState:
        if v not in TRAINER_STATES:
            raise ValueError(f"a trainer cannot report {v.value!r}")
        return v

    @field_validator("reason", mode="before")
    @classmethod
    def _reason(cls, v: Any) -> str:
        return str(v or "")[:MAX_LOG_MESSAGE]


class StepEvent(_Event):
    type: Literal["step"] = "step"
    step: _Step
    metrics: dict[str, float | None] = Field(max_length=MAX_METRICS_PER_STEP)

    @field_validator("metrics", mode="before")
    @classmethod
    def _numbers(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v  # pydantic says it is not a mapping
        out: dict[str, float | None] = {}
        for k, x in v.items():
            if x is not None and (isinstance(x, bool) or not isinstance(x, numbers.Real)):
                raise ValueError(f"{k}: must be a number, got {type(x).__name__}")
            out[str(k)] = _finite(x) if x is not None else None
        return out


def _finite(x: numbers.Real) -> float | None:
    """The value as a float, or None where it has none (NaN, infinities, an integer beyond float range)."""
    try:
        f = float(x)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None  # JSON has no NaN


class CheckpointEvent(_Event):
    type: Literal["checkpoint"] = "checkpoint"
    step: _Step
    path: str = Field(min_length=1, description="the checkpoint directory")


class LogEvent(_Event):
    type: Literal["log"] = "log"
    message: str = ""
    level: str = "info"

    @field_validator("message", mode="before")
    @classmethod
    def _message(cls, v: Any) -> str:
        return str(v)[:MAX_LOG_MESSAGE]

    @field_validator("level", mode="before")
    @classmethod
    def _level(cls, v: Any) -> str:
        return str(v)[:16]


class OtherEvent(_Event):
    """An event type this control plane does not know (a newer trainer's): stored and counted, not applied."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str = Field(min_length=1, max_length=64)


TrainerEvent = StateEvent | StepEvent | CheckpointEvent | LogEvent
_KNOWN: TypeAdapter[TrainerEvent] = TypeAdapter(Annotated[TrainerEvent, Field(discriminator="type")])
EVENT_TYPES = frozenset({"state", "step", "checkpoint", "log"})


def parse_event(raw: Any, index: int = 0) -> TrainerEvent | OtherEvent:
    """A trainer event from its JSON object; raises EventError naming the field (`events[index].field`)."""
    if not isinstance(raw, dict):
        raise EventError(f"events[{index}]: must be a JSON object")
    t = raw.get("type")
    if not isinstance(t, str) or not t:
        raise EventError(f"events[{index}].type: must be a non-empty string")
    if t == "log":  # older trainers wrote the text as `line` or `text`
        raw = {**raw, "message": raw.get("message", raw.get("line", raw.get("text", "")))}
    try:
        return _KNOWN.validate_python(raw) if t in EVENT_TYPES else OtherEvent.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(p) for p in err["loc"]]
        loc = loc[1:] if loc and loc[0] == t else loc  # the union's tag is not a field
        msg = err["msg"].removeprefix("Value error, ")
        if ": " in msg and loc and loc[-1] == "metrics":  # a metric's own error names the metric
            name, msg = msg.split(": ", 1)
            loc.append(name)
        raise EventError(f"events[{index}].{'.'.join(loc) or 'type'}: {msg}") from None


def json_safe(v: Any, depth: int = 0) -> Any:
    """Plain JSON values only: non-finite floats become null (JSON has no NaN, and a diverged loss must not
    break reporting), other objects become strings, and nesting stops at 16 levels."""
    if depth > 16:
        return str(v)
    if isinstance(v, dict):
        return {str(k): json_safe(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [json_safe(x, depth + 1) for x in v]
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if v is None or isinstance(v, bool | int | str):
        return v
    return str(v)
