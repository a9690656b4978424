"""Tiny real models and TRL trainers for the adapter tests: built from a config, tokenizer in-process, no hub.

The policy is a 2-layer GPT-2 (32 hidden) over a 28-token word vocabulary, saved once per session to a temp
directory (TRL rebuilds the reference model from the policy's ``_name_or_path``). Completions are at most 8
words, so a GRPO step takes a few hundredths of a second on CPU.

The *echo hack* used by several tests is a real reward hack that a tiny policy learns in about ten steps at a
high learning rate: the gold objective pays for distinct words, and from ``hack_from`` (until ``hack_until``)
the proxy reward also pays 0.5 per occurrence of the word ``x`` (a reward-model bug). The policy collapses onto
``"x x x x x x x x"``: proxy up, gold down, bigram repetition up -- the echo trap loopguard's repetition and
diversity signals are built for.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import transformers
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedTokenizerFast, TrainerCallback

transformers.logging.set_verbosity_error()

WORDS = [f"w{i}" for i in range(24)] + ["x"]
MAX_COMPLETION = 8


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


def save_tiny_model(folder, tokenizer):
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def fresh_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir)


def prompts_dataset(count=128):
    return Dataset.from_dict({"prompt": [f"w{i % 23} w{(i % 23) + 1}" for i in range(count)]})


def gold(completions):
    """The held-out objective: distinct words out of the 8 a completion may use."""
    return [len(set(text.split())) / MAX_COMPLETION for text in completions]


def make_echo_reward(hack_from, hack_until=10**9):
    def echo_reward(completions, trainer_state=None, **kwargs):
        step = trainer_state.global_step if trainer_state is not None else 0
        bonus = 0.5 if hack_from <= step < hack_until else 0.0
        return [
            g + bonus * text.split().count("x")
            for g, text in zip(gold(completions), completions, strict=True)
        ]

    return echo_reward


def grpo_config(output_dir, **overrides):
    from trl import GRPOConfig

    values = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        report_to=[],
        logging_steps=1,
        num_generations=4,
        per_device_train_batch_size=16,
        max_completion_length=MAX_COMPLETION,
        learning_rate=3e-2,
        lr_scheduler_type="constant",
        max_steps=40,
        beta=0.01,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        gradient_checkpointing=False,
        # TRL 1.10 turned the importance-weighted KL gradient on by default (off in 1.0-1.9): stated here so that
        # every supported TRL trains these tests with the same KL gradient (without it a given beta pulls harder)
        use_bias_correction_kl=True,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def trl_at_least(version):
    """Whether the installed TRL is ``version`` or newer (for the few behaviours that differ across the floor)."""
    import trl
    from packaging.version import Version

    return Version(trl.__version__) >= Version(version)


def grpo_trainer(model_dir, tokenizer, output_dir, reward_funcs, callbacks=None, **overrides):
    from trl import GRPOTrainer

    return GRPOTrainer(
        model=fresh_model(model_dir),
        reward_funcs=reward_funcs,
        args=grpo_config(output_dir, **overrides),
        train_dataset=prompts_dataset(),
        processing_class=tokenizer,
        callbacks=callbacks,
    )


def decisions(output_dir, name="mitigation_log.jsonl"):
    """The decision records of a run's mitigation log (without its start / resume / error events)."""
    from loopguard import read_mitigation_log

    return [r for r in read_mitigation_log(os.path.join(str(output_dir), name)) if r["event"] == "decision"]


class Spy(TrainerCallback):
    """Records what later callbacks see: logs, beta after each step, and anything ``probe`` returns."""

    def __init__(self, probe=None):
        self.logs, self.betas, self.probes, self.begin = [], {}, {}, {}
        self.probe = probe
        self.trainer = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.begin = {"beta": getattr(self.trainer, "beta", None), "step": state.global_step}

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer is not None:
            self.betas[state.global_step] = getattr(self.trainer, "beta", None)
            if self.probe is not None:
                self.probes[state.global_step] = self.probe(self.trainer, state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))
