"""Session fixtures for the iterative DPO tests (see recipe_helpers)."""

import pytest

pytest.importorskip("trl")

from recipe_helpers import build_tokenizer, save_tiny_policy


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory, tokenizer):
    """A tiny GPT-2 saved once; runs read it and never write into it."""
    return save_tiny_policy(tmp_path_factory.mktemp("tiny-policy"), tokenizer)
