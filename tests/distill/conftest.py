"""Fixtures for the distillation tests: two different tokenizers trained in-process (from the example)."""

import os
import pathlib
import runpy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def example():
    """The example script's namespace (tokenizer builders, corpus generator, main)."""
    return runpy.run_path(str(ROOT / "examples" / "distill_cross_tokenizer.py"), run_name="distill_example")


@pytest.fixture(scope="session")
def corpus(example):
    return example["make_corpus"](300, 0)


@pytest.fixture(scope="session")
def teacher_tok(example, corpus):
    """Byte-level BPE ("Ġ" markers)."""
    return example["teacher_tokenizer"](corpus)


@pytest.fixture(scope="session")
def student_tok(example, corpus):
    """Unigram with Metaspace ("▁" markers) and a smaller vocabulary."""
    return example["student_tokenizer"](corpus)


@pytest.fixture(scope="session")
def wordlevel_tok(corpus):
    """Whole words, no space markers."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        corpus, trainers.WordLevelTrainer(special_tokens=["[UNK]"], show_progress=False)
    )
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
