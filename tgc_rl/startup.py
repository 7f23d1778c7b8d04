"""What a process does before it first loads a model: start-up costs skipped in every learner rank, rollout
replica and driver. Imports nothing of ours and no pydantic, so the learner can use it on a bare GPU machine."""

from __future__ import annotations

import sys


def transformers_without_sklearn() -> None:
    """Call before this process first imports transformers' models or generation code: transformers imports
    scikit-learn (and with it SciPy) whenever it is installed, for assisted generation's ROC curve, which
    tgc-rl never uses; mlflow installs it beside us. That import cost 4-5 s in every learner rank, rollout
    replica and driver (importing AutoModelForCausalLM on a 2-core AVX2 CPU: 10.3-11.4 s -> 6.0 s)."""
    if "transformers.generation" in sys.modules:
        return  # already imported in this process: nothing left to save
    import transformers.utils
    from transformers.utils import import_utils

    import_utils.is_sklearn_available = transformers.utils.is_sklearn_available = lambda: False
