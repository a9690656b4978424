"""The mitigator observes exactly what the trainer trained on (real TRL GRPO, tiny GPT-2, CPU).

* Several generation batches per optimizer step (``generation_batch_size`` below the step's batch, so that
  ``steps_per_generation x num_iterations < gradient_accumulation_steps``): every batch is observed, and the
  step's observation holds the union of what the reward functions were given.
* Unscorable completions (every reward function returned None) are left out, as TRL leaves them out: the
  observed rewards are TRL's, never 0 in their place, and groups that lose members stay groups. (TRL before 1.6
  trained them as reward 0 -- nansum -- and counted them in its logged reward; the Guard leaves them out on every
  supported version.)
* A shaped reward: the Guard reads the raw reward while TRL trains on the shaped one.
"""

import zlib
from collections import Counter, defaultdict

import numpy as np
import pytest
from adapter_helpers import Spy, gold, grpo_trainer, trl_at_least

from loopguard import Guard, RewardHackMitigator, read_mitigation_log, shape_reward


def _record_observations(mitigator):
    """Keep every Observation the mitigator's (real) Guard steps on, by wrapping its bound ``step``."""
    seen = []
    step = mitigator.guard.step

    def recording(observation, **kwargs):
        seen.append(observation)
        return step(observation, **kwargs)

    mitigator.guard.step = recording
    return seen


def test_every_generation_batch_of_a_step_is_observed(model_dir, tokenizer, tmp_path):
    calls = defaultdict(list)  # optimizer step -> completions the reward function was given

    def distinct(completions, trainer_state=None, **kwargs):
        calls[trainer_state.global_step + 1].extend(completions)
        return gold(completions)

    # 16 completions per optimizer step, generated 8 at a time: 2 generation batches feed each step.
    trainer = grpo_trainer(
        model_dir,
        tokenizer,
        tmp_path,
        [distinct],
        max_steps=6,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        steps_per_generation=1,
    )
    assert trainer.args.generation_batch_size == 8
    mitigator = RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3))
    observed = _record_observations(mitigator)
    trainer.add_callback(mitigator)
    trainer.train()

    assert sum(len(batch) for batch in calls.values()) == 12 * 8  # 12 batches scored in 6 steps
    assert [obs.step for obs in observed] == [1, 2, 3, 4, 5, 6]
    for obs in observed:
        assert Counter(obs.completions) == Counter(calls[obs.step])  # the union of both batches
        assert len(obs.rewards) == 16
        assert obs.group_size == 4
        assert np.mean(obs.rewards) == pytest.approx(np.mean(gold(calls[obs.step])))
    records = read_mitigation_log(tmp_path / "mitigation_log.jsonl")
    decisions = [r for r in records if r.get("event", "decision") == "decision"]
    for record, obs in zip(decisions, observed, strict=True):
        assert record["reward_mean"] == pytest.approx(float(np.mean(obs.rewards)))
        # TRL's own per-step metric averages the two batches: the same mean
        assert record["extra"]["adapter"]["trainer_metrics"]["reward_std"] >= 0
        assert "2 generation batches fed this optimizer step" in " ".join(record["extra"]["adapter"]["batch_notes"])


def test_unscorable_completions_are_left_out_as_trl_does(model_dir, tokenizer, tmp_path):
    given = {}  # optimizer step -> (completions, returned rewards)
    rng = np.random.default_rng(0)

    def verifier(prompts, completions, trainer_state=None, **kwargs):
        """Cannot score prompts that start with an even word, nor ~1 in 5 other completions."""
        out = []
        for prompt, text in zip(prompts, completions, strict=True):
            if int(prompt.split()[0][1:]) % 2 == 0 or rng.random() < 0.2:
                out.append(None)
            else:
                out.append(len(set(text.split())) / 8 + zlib.crc32(text.encode()) / 2**32)  # continuous
        given[trainer_state.global_step + 1] = (list(completions), out)
        return out

    trl_excludes = trl_at_least("1.6")  # huggingface/trl#5902: unscorable rows out of TRL's baseline and logs
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [verifier], max_steps=8, learning_rate=0.0)
    mitigator = RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3))
    observed = _record_observations(mitigator)
    trainer.add_callback(mitigator)
    trainer.train()

    trl_reward = trainer.state.log_history
    per_step = {entry["step"]: entry for entry in trl_reward if "reward" in entry}
    assert len(observed) == 8
    dropped_somewhere = False
    for obs in observed:
        completions, rewards = given[obs.step]
        scored = [r for r in rewards if r is not None]
        dropped_somewhere |= len(scored) < len(rewards)
        assert list(obs.rewards) == pytest.approx(scored)  # TRL's rewards: unscorable rows left out, never 0
        assert list(obs.completions) == [c for c, r in zip(completions, rewards, strict=True) if r is not None]
        if trl_excludes:
            assert float(np.mean(obs.rewards)) == pytest.approx(per_step[obs.step]["reward"], abs=1e-6)
        else:  # TRL's logged reward counts the unscorable rows as 0; the Guard's does not
            assert sum(scored) / len(rewards) == pytest.approx(per_step[obs.step]["reward"], abs=1e-6)
        # groups keep their members (ragged where a completion was unscorable), in order
        sizes = obs.group_sizes if obs.group_sizes is not None else (obs.group_size,) * (len(obs.rewards) // 4)
        expected = [sum(r is not None for r in rewards[g : g + 4]) for g in range(0, len(rewards), 4)]
        assert list(sizes) == [n for n in expected if n]
    assert dropped_somewhere
    # A frozen policy with a continuous reward: the Guard sees no zero-variance group, and neither does TRL 1.6+
    # (TRL 1.0-1.5 scores the unscorable rows 0, so a group with none scorable is flat there).
    log = read_mitigation_log(tmp_path / "mitigation_log.jsonl")
    records = [r for r in log if r.get("event", "decision") == "decision"]
    assert [r["signals"]["collapse.zero_std_groups"] for r in records] == [0.0] * 8
    trainer_zero_std = [r["extra"]["adapter"]["trainer_metrics"]["frac_reward_zero_std"] for r in records]
    if trl_excludes:
        assert trainer_zero_std == [0.0] * 8
    else:
        assert max(trainer_zero_std) > 0.0


def test_the_guard_reads_the_raw_reward_while_trl_trains_on_the_shaped_one(model_dir, tokenizer, tmp_path):
    """On every supported TRL: the Observation holds the reward function's raw outputs, completion by
    completion, while TRL's per-function rewards (what its advantages are computed from) are the shaped ones."""

    def proxy(completions, **kwargs):
        return [float(len(text.split())) for text in completions]

    shaped = shape_reward(proxy, "length", 0.5, target_length=2)
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [shaped], max_steps=4)
    mitigator = RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3))
    observed = _record_observations(mitigator)
    spy = Spy(
        probe=lambda t, _state: (list(t._logs["completion"]), list(t._logs["rewards"]["proxy"]), shaped.last_call)
    )
    spy.trainer = trainer
    trainer.add_callback(mitigator)
    trainer.add_callback(spy)
    trainer.train()

    assert [obs.step for obs in observed] == [1, 2, 3, 4]
    trained_means = {e["step"]: e["rewards/proxy/mean"] for e in trainer.state.log_history if "loss" in e}
    for obs in observed:
        completions, trained, call = spy.probes[obs.step]
        raw = proxy(completions)
        assert list(call.raw) == raw  # the wrapper's own record of the step's batch
        assert list(call.shaped) == pytest.approx(trained)
        assert list(obs.completions) == completions
        assert list(obs.rewards) == pytest.approx(raw)  # the Guard scores the raw reward
        penalties = [r - t for r, t in zip(raw, trained, strict=True)]
        assert penalties == pytest.approx(list(call.penalties))  # TRL trains on raw - penalty
        assert min(penalties) >= 0.0
        assert np.mean(trained) < np.mean(raw) - 0.1  # lower, and by a margin
        assert trained_means[obs.step] == pytest.approx(np.mean(trained), abs=1e-5)  # what TRL logs too


def test_rloo_every_batch_of_a_step_and_unscorable_completions(model_dir, tokenizer, tmp_path):
    from adapter_helpers import fresh_model, prompts_dataset
    from trl import RLOOConfig, RLOOTrainer

    given = defaultdict(list)  # optimizer step -> (completion, reward) pairs the reward function saw

    def verifier(prompts, completions, trainer_state=None, **kwargs):
        out = [
            None if int(p.split()[0][1:]) % 3 == 0 or zlib.crc32(c.encode()) % 4 == 0 else len(set(c.split())) / 8
            for p, c in zip(prompts, completions, strict=True)
        ]
        given[trainer_state.global_step + 1].extend(zip(completions, out, strict=True))
        return out

    args = RLOOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], logging_steps=1, max_steps=4,
        save_strategy="no", seed=0, disable_tqdm=True, gradient_checkpointing=False, learning_rate=1e-2,
        beta=0.05, num_generations=4, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        steps_per_generation=1, max_completion_length=8,
    )
    trainer = RLOOTrainer(
        model=fresh_model(model_dir), reward_funcs=verifier, args=args, train_dataset=prompts_dataset(),
        processing_class=tokenizer,
    )
    mitigator = RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3))
    observed = _record_observations(mitigator)
    trainer.add_callback(mitigator)
    trainer.train()

    assert [obs.step for obs in observed] == [1, 2, 3, 4]
    dropped = 0
    for obs in observed:
        pairs = given[obs.step]
        assert len(pairs) == 16  # two generation batches of 8 fed each step
        scored = [(c, r) for c, r in pairs if r is not None]
        dropped += len(pairs) - len(scored)
        assert Counter(obs.completions) == Counter(c for c, _ in scored)  # every batch, unscorable left out
        assert sorted(obs.rewards) == pytest.approx(sorted(r for _, r in scored))
    assert dropped > 0
