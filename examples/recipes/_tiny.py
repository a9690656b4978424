"""The tiny stand-ins the recipes train, so that each recipe runs in seconds on a CPU with no download.

Every recipe imports three things from here, and each is one line to swap for your own:

* ``tiny_policy()`` returns ``(model_name_or_path, tokenizer)``: a 2-layer GPT-2 (32 hidden) saved to a temp
  folder, over a 28-word tokenizer built in-process. Swap in your model id and its tokenizer::

      model_id = "Qwen/Qwen2.5-0.5B-Instruct"
      tokenizer = AutoTokenizer.from_pretrained(model_id)

  (TRL rebuilds the KL reference model from the policy's path, which is why this saves the model to disk.)
  ``initializer_range=0.2`` gives the random model's logits some spread: with GPT-2's 0.02 they are nearly
  flat, and a LoRA adapter on the attention and MLP layers could not move them. A real model needs nothing
  of the kind.
* ``prompts()``: a ``datasets.Dataset`` with a ``"prompt"`` column. Swap in your prompt dataset.
* ``flawed_reward`` / ``honest_reward``: the reward functions. ``flawed_reward`` stands for a reward model
  with a bug: it pays for distinct words (what we want) and also 0.5 for every ``x`` (what we do not want).
  A policy trained on it collapses onto ``"x x x x x x x x"`` within about ten steps: an echo trap, the
  reward hack loopguard's default signals (repetition, diversity) see. ``honest_reward`` is the
  distinct-word part alone (the "gold"). Swap in your reward model or reward functions.

``quiet()`` turns off the progress bars and library warnings, so a recipe's own output stays readable.
"""

from __future__ import annotations

import os
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

WORDS = [f"w{i}" for i in range(24)] + ["x"]
MAX_WORDS = 8  # the longest completion, in words (one word is one token)


def quiet() -> None:
    """Progress bars and Python warnings off; one torch thread (fastest for a model this small).

    transformers' logging stays at its default (WARNING), as in your own script: loopguard's status lines
    follow it (see docs/trl.md, "What you see while it runs").
    """
    import datasets
    import torch
    import transformers

    torch.set_num_threads(1)
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def tiny_policy(folder: str | None = None, *, initializer_range: float = 0.02) -> tuple[str, object]:
    """Save a tiny GPT-2 and its tokenizer to ``folder`` (a new temp folder by default); returns both."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{word: i + 3 for i, word in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )
    config = GPT2Config(
        vocab_size=len(vocab), n_positions=64, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=2, eos_token_id=1, pad_token_id=0, initializer_range=initializer_range,
    )  # fmt: skip
    folder = folder or tempfile.mkdtemp(prefix="tiny-policy-")
    torch.manual_seed(0)  # the same weights in every process
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer


def prompts(count: int = 128):
    """Two-word prompts (``"w3 w4"``), as a dataset with a ``"prompt"`` column."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"w{i % 23} w{i % 23 + 1}" for i in range(count)]})


def honest_reward(completions: list[str], **kwargs) -> list[float]:
    """What we want (the gold): distinct words, out of the 8 a completion may use."""
    return [len(set(text.split())) / MAX_WORDS for text in completions]


def flawed_reward(completions: list[str], **kwargs) -> list[float]:
    """A reward model with a bug: the gold, plus 0.5 for every ``x`` (a policy learns to write only ``x``)."""
    gold = honest_reward(completions)
    return [g + 0.5 * text.split().count("x") for g, text in zip(gold, completions, strict=True)]
