"""The FSDP2 learner: `Learner` (one rank, a plain class) and `LearnerGroup` (its ranks as Ray actors)."""

from services.learner.group import LearnerGroup, LearnerGroupError
from services.learner.learner import Learner

__all__ = ["Learner", "LearnerGroup", "LearnerGroupError"]
