"""What a process does before it first loads a model: start-up costs skipped in every learner rank, rollout
replica and driver. Imports nothing of ours and no pydantic, so the learner can use it on a bare GPU machine."""

from __future__ import annotations

import os
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


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a `taskset`, a container's cpuset), not the host's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def set_torch_threads(wanted: int) -> int:
    """Sets torch's intra-op threads to `wanted`, capped by `usable_cpus()`, and returns the count. More OpenMP
    threads than CPUs wait at every parallel region's barrier for a descheduled thread: on a 2-core AVX2 CPU, a
    matmul loop on 2 threads beside one busy process took 19.3 s against 8.7 s on 1 thread (NOTES.md, twentieth
    session)."""
    import torch

    threads = max(1, min(wanted, usable_cpus()))
    torch.set_num_threads(threads)
    return threads
