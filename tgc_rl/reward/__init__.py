"""The reward side: verifier worker pools (math, code, reasoning-gym, custom) and the code sandbox.

`RewardPool` is the plain class (no Ray); `RewardPoolActor` is its Ray actor wrapper and `RewardPoolGroup`
spreads batches over several such actors; both are imported lazily so that using the pool needs no Ray.
"""

from typing import Any

from tgc_rl.reward.pool import RewardPool, RewardPoolError

__all__ = ["RewardPool", "RewardPoolActor", "RewardPoolError", "RewardPoolGroup", "start_reward_pool_actor"]


def __getattr__(name: str) -> Any:
    if name in ("RewardPoolActor", "RewardPoolGroup", "start_reward_pool_actor"):
        from tgc_rl.reward import actor

        return getattr(actor, name)
    raise AttributeError(f"module 'tgc_rl.reward' has no attribute {name!r}")
