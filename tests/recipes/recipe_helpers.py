"""Tiny real models for the iterative DPO tests: built from a config, tokenizer in-process, no hub.

The policy is a 2-layer GPT-2 (32 hidden) over a 27-token word vocabulary; completions are at most 6 words,
so a round (sample, score, pair, a few DPO steps, audit) takes about a second on CPU. Prompts end with a
space so a completion can be appended as text (what DPOTrainer does).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2ForSequenceClassification,
    PreTrainedTokenizerFast,
)

transformers.logging.set_verbosity_error()

WORDS = [f"w{i}" for i in range(24)]
PROMPTS = [f"w{i} w{i + 1} " for i in range(8)]


def build_tokenizer():
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2}
    for word in WORDS:
        vocab[word] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )


def _config(tokenizer, **extra):
    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
        **extra,
    )


def tiny_policy(tokenizer, seed=0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(_config(tokenizer))


def save_tiny_policy(folder, tokenizer):
    tiny_policy(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def tiny_reward_model(tokenizer, seed=1):
    torch.manual_seed(seed)
    return GPT2ForSequenceClassification(_config(tokenizer, num_labels=1))


def low_words(prompts, completions):
    """A proxy reward: the share of a completion's words among w0..w11 (length-neutral)."""
    scores = []
    for text in completions:
        words = text.split()
        scores.append(sum(int(w[1:]) < 12 for w in words) / len(words) if words else 0.0)
    return scores


def dpo_args(**overrides):
    values = dict(
        use_cpu=True,
        bf16=False,
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        lr_scheduler_type="constant",
        max_length=24,
    )
    values.update(overrides)
    return values


def state(folder):
    return {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(folder).state_dict().items()}


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
