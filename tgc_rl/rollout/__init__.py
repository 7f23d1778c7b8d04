"""Generation for the RL loop: rollout engines (vLLM or transformers), the Ray actor that hosts one, and the
pool of replicas the trainer drives. Weights arrive from the learner through tgc_rl.weight_sync."""

from tgc_rl.rollout.actor import make_engine
from tgc_rl.rollout.engine import RolloutEngine, engine_kind, sample_seed
from tgc_rl.rollout.spec import RolloutSpec

__all__ = ["RolloutEngine", "RolloutPool", "RolloutSpec", "engine_kind", "make_engine", "sample_seed"]


def __getattr__(name: str):
    # the pool imports Ray; keep `import tgc_rl.rollout` light for plain-engine users
    if name == "RolloutPool":
        from tgc_rl.rollout.pool import RolloutPool

        return RolloutPool
    raise AttributeError(name)
