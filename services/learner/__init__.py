"""The FSDP2 learner: `Learner` (one rank, a plain class, given its `LearnerSpec` slice of the job spec) and
`LearnerGroup` (its ranks as Ray actors)."""

from services.learner.group import LearnerGroup, LearnerGroupError
from services.learner.learner import Learner
from services.learner.spec import LearnerSpec

__all__ = ["Learner", "LearnerGroup", "LearnerGroupError", "LearnerSpec"]
