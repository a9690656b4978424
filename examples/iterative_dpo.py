"""Iterative DPO with safety gates, on CPU in under a minute: an honest run, then a reward model with a bug.

A tiny GPT-2 (2 layers, 32 hidden) over a 24-word vocabulary is built from a config with an in-process
tokenizer (nothing is downloaded). Each round samples 8 completions for each of 32 prompts, pairs best
against worst, trains 8 DPO steps against the previous round's policy, then audits the candidate.

* **Honest run.** The reward pays for words from the first half of the vocabulary (``w0`` .. ``w11``); the
  gold audit is the same function. Every round is promoted and the reward climbs.
* **Buggy reward model.** The reward also pays 0.5 for every ``w0`` (a reward-model bug). The policy learns
  to say ``w0 w0 w0 ...``: the proxy reward soars while the gold audit (distinct words, what we really want)
  and diversity fall. The gates block the hacked rounds and the run stops with an explanation; the last
  policy that passed stays the result.

The training settings keep what the gates measure from hinging on the last bits of a float (the thread
count changes those bits):

* **SGD, not Adam.** Adam moves every weight by about the learning rate however small its gradient. Once
  most completions are good, chosen and rejected texts share most words and the DPO gradient nearly
  cancels; Adam still takes full-size steps, in whatever direction rounding noise points, so a tiny model
  could collapse onto one word or swing to the words it was taught to avoid in a round whose DPO loss fell
  -- and which round did so changed with the thread count. SGD steps scale with the gradient: a weak,
  noisy direction barely moves the policy, and every round is a small, reproducible step.
* **beta 1.0**: a tight anchor to the round's reference.
* **256 audit samples** (8 completions x 32 prompts): each gate is a statistic of the audit samples, and
  more of them means less sampling noise in its value.

Run: ``python examples/iterative_dpo.py`` (add ``--rounds 4`` for more rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedTokenizerFast

from loopguard.recipes import IterativeDPO

transformers.logging.set_verbosity_error()

Scorer = Callable[[list[str], list[str]], list[float]]

WORDS = [f"w{i}" for i in range(24)]
PROMPTS = [f"w{i % 24} w{(i + 5) % 24} " for i in range(32)]  # a trailing space: completions append as text


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, **{word: i + 3 for i, word in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )


def build_policy(tokenizer: PreTrainedTokenizerFast) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=32, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config)


def low_words(prompts: list[str], completions: list[str]) -> list[float]:
    """Share of a completion's words among w0..w11 (0 for an empty completion)."""
    return [
        sum(int(w[1:]) < 12 for w in t.split()) / len(t.split()) if t.split() else 0.0 for t in completions
    ]


def buggy_reward(prompts: list[str], completions: list[str]) -> list[float]:
    """The same reward plus a bug: 0.5 for every occurrence of ``w0``."""
    return [
        r + 0.5 * t.split().count("w0")
        for r, t in zip(low_words(prompts, completions), completions, strict=True)
    ]


def distinct_words(prompts: list[str], completions: list[str]) -> list[float]:
    """The gold audit: distinct words out of the 8 a completion may use."""
    return [len(set(t.split())) / 8 for t in completions]


def run(title: str, reward: Scorer, gold: Scorer, rounds: int, output_dir: str) -> None:
    tokenizer = build_tokenizer()
    recipe = IterativeDPO(
        build_policy(tokenizer), tokenizer, PROMPTS, reward, rounds=rounds, output_dir=output_dir,
        samples_per_prompt=8, pairing="max_min", gold=gold, max_new_tokens=8, beta=1.0,
        dpo_args={"use_cpu": True, "bf16": False, "max_steps": 8, "per_device_train_batch_size": 8,
                  "optim": "sgd", "learning_rate": 0.3, "lr_scheduler_type": "constant", "max_length": 32},
    )  # fmt: skip
    start = time.perf_counter()
    result = recipe.run()
    print(f"\n== {title} ({time.perf_counter() - start:.0f} s) ==")
    print(f"{'round':>5}  {'promoted':>8}  {'pairs':>5}  {'reward before -> after':>22}  {'gold':>13}  rep.")
    for record in result.rounds:
        with open(os.path.join(output_dir, record["metrics"])) as handle:
            m = json.load(handle)
        gates = {g["name"]: g["value"] for g in m["gates"]}
        after = m.get(
            "audit", {"reward": {"mean": float("nan")}, "gold_mean": float("nan")}
        )  # none: no pairs
        gold_text = f"{m['samples']['gold_mean']:.2f} -> {after['gold_mean']:.2f}"
        reward_text = f"{m['samples']['reward']['mean']:.2f} -> {after['reward']['mean']:.2f}"
        print(
            f"{record['round']:>5}  {'yes' if record['promoted'] else 'NO':>8}  {m['pairs']['count']:>5}  "
            f"{reward_text:>22}  {gold_text:>13}  {gates.get('repetition', float('nan')):.2f}"
        )
        for reason in record["reasons"]:
            print(f"       blocked: {reason}")
    print(result.explanation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        run("honest reward", low_words, low_words, args.rounds, os.path.join(folder, "honest"))
        run(
            "reward model with a w0 bug",
            buggy_reward,
            distinct_words,
            args.rounds,
            os.path.join(folder, "buggy"),
        )


if __name__ == "__main__":
    main()
