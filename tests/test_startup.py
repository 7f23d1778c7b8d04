"""Start-up costs skipped before a process loads a model (tgc_rl/startup.py)."""

import importlib.util
import subprocess
import sys

import pytest

IMPORT_MODELS = (
    "from transformers import AutoModelForCausalLM; import transformers.generation.candidate_generator; "
    "print('sklearn' in sys.modules, 'scipy' in sys.modules)"
)


def _imports(prelude: str) -> str:
    code = f"import sys; {prelude}; {IMPORT_MODELS}"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="scikit-learn is not installed here")
def test_loading_a_model_skips_scikit_learn_and_scipy_that_transformers_would_import():
    assert (
        _imports("pass") == "True True"
    )  # what transformers does on its own where scikit-learn is installed
    skipped = "from tgc_rl.startup import transformers_without_sklearn; transformers_without_sklearn()"
    assert _imports(skipped) == "False False"


def test_the_start_up_module_imports_nothing_heavy():
    code = "import sys, tgc_rl.startup; print(sorted(m for m in ('pydantic', 'torch', 'transformers') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"  # the learner imports it on a bare GPU machine (no pydantic)
