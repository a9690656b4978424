"""Session fixtures for the adapter tests: one tokenizer and one tiny saved policy (see adapter_helpers)."""

import pytest

pytest.importorskip("trl")

from adapter_helpers import build_tokenizer, save_tiny_model


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread, and a busy machine cannot stall it with spinning workers."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer):
    """A tiny GPT-2 saved once; tests load a fresh copy with ``fresh_model(model_dir)``."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny-gpt2"), tokenizer)
