"""The tiny policy: an in-process word-level tokenizer and a 2-layer GPT-2 built from a config.

Nothing is downloaded. The tokenizer maps every word of :data:`~benchmarks.goodhart.scenarios.WORDS` to one
id. The policy is a GPT-2 with 2 layers and 64 hidden units, initialised from ``seed``.

Every scenario's policy starts from a short supervised warm start, as RLHF starts from an SFT model: a few
hundred steps on prompts followed by 1-6 words and an end-of-sequence token, where each word is, with
probability :data:`GOOD_SHARE`, a good word not yet in the completion (text the gold rewards) and otherwise a
random word; one completion in 20 holds the rare word ``zz`` and one in 12 the word ``w250`` (the features the
sentinel and token proxies over-reward, which an SFT model writes now and then). The reference is then a
competent model that writes short answers of every length, about two thirds good words (a freshly initialised
model almost never emits the end token, so every completion would already be as long as allowed, and it writes
no good words). The ``signoff`` warm start (the phrase scenario) is the same, with one completion in five
followed by the phrase ``w297 w298 w299``, as a chat model's supervised data holds a canned sign-off now and
then: the flawed proxy then has something to amplify.
"""

from __future__ import annotations

import os
import random

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedTokenizerFast

from benchmarks.goodhart.scenarios import BONUS_TOKEN, N_GOOD, N_WORDS, PHRASE, SENTINEL, WORDS

PAD, EOS, BOS = 0, 1, 2
PROMPT_WORDS = 4
WARM_START_MAX_WORDS = 6
SIGNOFF_SHARE = 0.2  # the share of the signoff warm start's completions that end with the phrase
GOOD_SHARE = 0.7  # the chance that a warm-start word is a (new) good word
# The reference writes each exploitable feature now and then, as an SFT model does: the rare word in one
# completion in 20, the bonus word in one in 12 (the sign-off share is the signoff warm start's).
SENTINEL_SHARE = 0.05
BONUS_SHARE = 1 / 12
WARM_STARTS = ("sft", "signoff")


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": PAD, "<eos>": EOS, "<bos>": BOS}
    for word in WORDS:
        vocab[word] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )


def prompts(seed: int, count: int) -> list[str]:
    """``count`` prompts of four random words (the same words for every arm of a seed)."""
    rng = random.Random(10_000 + seed)
    return [" ".join(rng.choice(WORDS[:N_WORDS]) for _ in range(PROMPT_WORDS)) for _ in range(count)]


def _sft_completion(rng: random.Random, signoff: float) -> list[str]:
    """1-6 words, each a good word not yet used with probability GOOD_SHARE, else a random word."""
    words: list[str] = []
    for _ in range(rng.randint(1, WARM_START_MAX_WORDS)):
        unused = [word for word in WORDS[:N_GOOD] if word not in words]
        words.append(rng.choice(unused) if rng.random() < GOOD_SHARE else rng.choice(WORDS[:N_WORDS]))
    for word, share in ((SENTINEL, SENTINEL_SHARE), (BONUS_TOKEN, BONUS_SHARE)):
        if rng.random() < share:
            words[rng.randrange(len(words))] = word
    if rng.random() < signoff:
        words += list(PHRASE)
    return words


def _warm_start(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, seed: int, signoff: float = 0.0
) -> None:
    rng = random.Random(20_000 + seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(400):
        rows = []
        for _ in range(32):
            prompt = [rng.choice(WORDS[:N_WORDS]) for _ in range(PROMPT_WORDS)]
            completion = _sft_completion(rng, signoff)
            ids = tokenizer.convert_tokens_to_ids(prompt + completion)
            rows.append([*ids, EOS])
        width = max(len(row) for row in rows)
        input_ids = torch.tensor([row + [PAD] * (width - len(row)) for row in rows])
        labels = input_ids.clone()
        labels[input_ids == PAD] = -100
        labels[:, :PROMPT_WORDS] = -100
        loss = model(input_ids=input_ids, attention_mask=(input_ids != PAD).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def save_initial_policy(folder: str, tokenizer: PreTrainedTokenizerFast, seed: int, warm_start: str) -> str:
    """Build and warm-start the seed's initial policy, save it with its tokenizer; returns ``folder``."""
    if warm_start not in WARM_STARTS:
        msg = f"`warm_start` must be one of {WARM_STARTS}, got {warm_start!r}."
        raise ValueError(msg)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=32, n_embd=64, n_layer=2, n_head=2,
        bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    _warm_start(model, tokenizer, seed, signoff=SIGNOFF_SHARE if warm_start == "signoff" else 0.0)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
