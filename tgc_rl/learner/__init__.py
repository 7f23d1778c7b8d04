"""The FSDP2 learner: `Learner` (one rank, a plain class, given its `LearnerSpec` slice of the job spec) and
`LearnerGroup` (its ranks as Ray actors)."""

from typing import TYPE_CHECKING, Any

from tgc_rl.learner.learner import Learner
from tgc_rl.learner.spec import LearnerSpec

if TYPE_CHECKING:  # pragma: no cover
    from tgc_rl.learner.group import LearnerGroup, LearnerGroupError

__all__ = ["Learner", "LearnerGroup", "LearnerGroupError", "LearnerSpec"]


def __getattr__(name: str) -> Any:
    # Lazy: the group needs Ray, a rank does not (scripts/gpu-check.sh drives a Learner where Ray is absent).
    if name in ("LearnerGroup", "LearnerGroupError"):
        from tgc_rl.learner import group

        return getattr(group, name)
    raise AttributeError(f"module 'tgc_rl.learner' has no attribute {name!r}")
