"""Beta accessors on other real trainers: RLOO (``beta``), online DPO (``_beta``), DPO (``beta``), and a plain
``transformers.Trainer`` REINFORCE loop whose KL coefficient lives in ``kl_coef`` (``coefficient=``).

RLOO and online DPO learn the same real echo hack as the GRPO tests (conftest), so beta is raised by a real
trip. Offline DPO has no rollouts: the test checks the accessor and that the implicit reward margins are read.
"""

import pytest
import torch
from adapter_helpers import MAX_COMPLETION, decisions, fresh_model, make_echo_reward, prompts_dataset
from datasets import Dataset
from transformers import Trainer, TrainingArguments

import loopguard
from loopguard import BangBang, Guard, RewardHackMitigator


def _records(output_dir):
    return decisions(output_dir)


def _common(output_dir, **overrides):
    values = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        report_to=[],
        logging_steps=1,
        learning_rate=3e-2,
        lr_scheduler_type="constant",
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    values.update(overrides)
    return values


def test_rloo_beta_accessor(model_dir, tokenizer, tmp_path):
    from trl import RLOOConfig, RLOOTrainer

    args = RLOOConfig(
        **_common(tmp_path, max_steps=30, beta=0.05),
        num_generations=4,
        per_device_train_batch_size=16,
        max_completion_length=MAX_COMPLETION,
    )
    trainer = RLOOTrainer(
        model=fresh_model(model_dir),
        reward_funcs=make_echo_reward(4),
        args=args,
        train_dataset=prompts_dataset(),
        processing_class=tokenizer,
    )
    mitigator = RewardHackMitigator(guard=Guard(controller=BangBang(gain=3.0), warmup_steps=4))
    trainer.add_callback(mitigator)
    trainer.train()

    assert mitigator._accessor.where == "trainer.beta"
    records = _records(tmp_path)
    assert records[0]["beta_before"] == 0.05  # read from RLOO's trainer.beta
    raised = [r for r in records if r["action"] == "raise_beta"]
    assert raised, "".join(r["verdict"][0] for r in records)
    assert trainer.beta == records[-1]["beta_after"] > 0.05  # written back into trainer.beta


def test_online_dpo_beta_accessor_reads_rewards_through_a_tap(model_dir, tokenizer, tmp_path):
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    args = OnlineDPOConfig(
        **_common(tmp_path, max_steps=24, beta=0.1),
        per_device_train_batch_size=8,
        max_new_tokens=MAX_COMPLETION,
    )
    tapped = loopguard.tap(make_echo_reward(4))
    trainer = OnlineDPOTrainer(
        model=fresh_model(model_dir),
        reward_funcs=[tapped],
        args=args,
        train_dataset=prompts_dataset(),
        processing_class=tokenizer,
    )
    mitigator = RewardHackMitigator(guard=Guard(controller=BangBang(gain=3.0), warmup_steps=4))
    trainer.add_callback(mitigator)  # the tapped function is found among trainer.reward_funcs
    trainer.train()

    assert mitigator._accessor.where == "trainer._beta"
    records = _records(tmp_path)
    assert {r["extra"]["adapter"]["source"] for r in records} == {"tap"}
    assert len(records) == 24  # one tapped call per step: 8 prompts x 2 completions
    assert any(r["action"] == "raise_beta" for r in records), "".join(r["verdict"][0] for r in records)
    assert trainer._beta == trainer.beta == records[-1]["beta_after"] > 0.1


def test_dpo_beta_accessor_and_implicit_reward_margins(model_dir, tokenizer, tmp_path):
    from trl import DPOConfig, DPOTrainer

    dataset = Dataset.from_dict(
        {
            "prompt": [f"w{i % 23} w{i % 23 + 1}" for i in range(32)],
            "chosen": [" w3 w4 w5"] * 32,
            "rejected": [" x x x"] * 32,
        }
    )
    args = DPOConfig(
        **_common(tmp_path, max_steps=6, beta=0.1, learning_rate=1e-2), per_device_train_batch_size=8
    )
    trainer = DPOTrainer(
        model=fresh_model(model_dir), args=args, train_dataset=dataset, processing_class=tokenizer
    )
    mitigator = RewardHackMitigator(guard=Guard(mode="kl_control", warmup_steps=3))
    trainer.add_callback(mitigator)
    # no signal that can vote sees offline DPO's metrics: a KL-changing mode says so at the start
    with pytest.warns(RuntimeWarning, match=r"mode='kl_control' will never change beta.*Pass mode='log_only'"):
        trainer.train()

    assert mitigator._accessor.where == "trainer.beta"
    assert mitigator.beta == 0.1
    records = _records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert {r["extra"]["adapter"]["source"] for r in records} == {"metrics"}
    margins = [entry["rewards/margins"] for entry in trainer.state.log_history if "rewards/margins" in entry]
    # the Guard saw the implicit reward margin divided by beta (the log-ratio margin)
    assert [r["reward_mean"] for r in records] == pytest.approx([m / 0.1 for m in margins], rel=1e-4)
    assert mitigator.metrics()["loopguard/beta"] == 0.1
    # the signals that read completions never measured anything: absent from the metrics, not logged as 0
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert "loopguard/score/drift" in logged
    assert not {"loopguard/score/repetition", "loopguard/score/diversity"} & logged


class ReinforceTrainer(Trainer):
    """A plain REINFORCE loop with a KL penalty: no ``beta`` attribute, the coefficient is ``kl_coef``.

    Each step samples 4 completions per prompt, scores them with the (tapped) reward function, and minimises
    ``-(r - mean_group(r)) * log p + kl_coef * (log p - log p_ref)`` over completion tokens.
    """

    def __init__(self, *args, reward_fn, ref_model, tokenizer, kl_coef, **kwargs):
        super().__init__(*args, **kwargs)
        self.reward_fn, self.ref_model, self.tok, self.kl_coef = reward_fn, ref_model, tokenizer, kl_coef

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        prompts = inputs["input_ids"].repeat_interleave(4, dim=0)
        width = prompts.shape[1]
        with torch.no_grad():
            sequences = model.generate(
                prompts,
                do_sample=True,
                top_k=0,
                max_new_tokens=MAX_COMPLETION,
                pad_token_id=0,
                eos_token_id=1,
            )
        completion_ids = sequences[:, width:]
        mask = (completion_ids != 0).float()
        texts = self.tok.batch_decode(completion_ids, skip_special_tokens=True)
        rewards = torch.tensor(
            self.reward_fn(
                prompts=self.tok.batch_decode(prompts), completions=texts, trainer_state=self.state
            ),
            dtype=torch.float32,
        )
        advantages = rewards - rewards.view(-1, 4).mean(dim=1).repeat_interleave(4)

        def token_logps(net):
            logits = net(sequences).logits[:, width - 1 : -1]
            return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)

        logps = token_logps(model)
        with torch.no_grad():
            ref_logps = token_logps(self.ref_model)
        tokens = mask.sum().clamp(min=1.0)
        policy = -(advantages.unsqueeze(1) * logps * mask).sum() / tokens
        kl = ((logps - ref_logps) * mask).sum() / tokens
        return policy + self.kl_coef * kl


def test_generic_coefficient_accessor_on_a_plain_loop(model_dir, tokenizer, tmp_path):
    prompts = tokenizer([f"w{i % 23} w{i % 23 + 1}" for i in range(256)], add_special_tokens=False)[
        "input_ids"
    ]
    tapped = loopguard.tap(make_echo_reward(6))
    ref_model = fresh_model(model_dir).eval()
    trainer = ReinforceTrainer(
        model=fresh_model(model_dir),
        args=TrainingArguments(
            **_common(tmp_path, max_steps=30), per_device_train_batch_size=4, remove_unused_columns=False
        ),
        train_dataset=Dataset.from_dict({"input_ids": prompts}),
        reward_fn=tapped,
        ref_model=ref_model,
        tokenizer=tokenizer,
        kl_coef=0.05,
    )
    mitigator = RewardHackMitigator(
        guard=Guard(mode="kl_control", controller=BangBang(gain=3.0), warmup_steps=4),
        coefficient=(lambda: trainer.kl_coef, lambda value: setattr(trainer, "kl_coef", value)),
        taps=[tapped],
        group_size=4,
    )
    trainer.add_callback(mitigator)
    trainer.train()

    records = _records(tmp_path)
    assert len(records) == 30
    assert records[0]["beta_before"] == 0.05
    assert any(r["action"] == "raise_beta" for r in records), "".join(r["verdict"][0] for r in records)
    assert trainer.kl_coef == records[-1]["beta_after"] > 0.05
