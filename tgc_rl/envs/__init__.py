"""Multi-turn environments: the contract, the built-ins, bounds, and token-exact trajectories (issue 30).

A job selects one with `env:` (tgc_rl.config.JobSpec); the trainer drives TrajectoryRuns with
tgc_rl/trainer/multi_turn.py and runs the environments in worker processes beside the reward workers
(tgc_rl/reward/env_host.py). docs/multi_turn.md says what is built and what is not.
"""

from tgc_rl.envs.base import (
    BoundHit,
    EndReason,
    EnvContext,
    Environment,
    Message,
    StepInfo,
    StepResult,
)
from tgc_rl.envs.bounds import EnvBounds
from tgc_rl.envs.registry import BUILTIN_PARAMS, EnvSpec, load_env
from tgc_rl.envs.rollout import GenerateRequest, Sample, Trajectory, TrajectoryRun
from tgc_rl.envs.tokens import BridgeError, ChatTemplate, TrajectoryBuilder

__all__ = [
    "BUILTIN_PARAMS",
    "BoundHit",
    "BridgeError",
    "ChatTemplate",
    "EndReason",
    "EnvBounds",
    "EnvContext",
    "EnvSpec",
    "Environment",
    "GenerateRequest",
    "Message",
    "Sample",
    "StepInfo",
    "StepResult",
    "Trajectory",
    "TrajectoryBuilder",
    "TrajectoryRun",
    "load_env",
]
