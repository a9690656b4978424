"""GRPO with a flawed reward model: the full protection, every part configured explicitly.

Run:  python examples/recipes/grpo_full_protection.py

The one-liner (``grpo_one_liner.py``) uses every default. This recipe names each part, so you can see and
tune what protects the run:

* **shaping**: ``shape_reward`` puts a bounded penalty on a feature you already know the reward model
  overpays (here repetition) and keeps the raw reward observable: the Guard scores the unshaped reward;
* **more signals**: a second reward model, watched but not trained on (``reward_weights`` 0), makes the
  ensemble-disagreement signal possible (``RMEnsemble``); ``"takeover"`` sees a token or phrase spreading
  through the batch; ``GoldAudit`` asks a held-out judge about a few completions every few steps;
* **the response**: ``mode="kl_control"`` (bang-bang on beta) and an ``EscalationLadder``: a targeted
  penalty on what the reward overpays, one rollback (the KL reference re-anchored on the restored policy),
  then a stop with the last good policy restored;
* **rollback checkpoints** in a folder you choose, every ``checkpoint_every`` steps while the run is healthy
  (marked good once the Guard confirms them); loopguard's state also goes into each trainer ``checkpoint-N``
  for ``resume_from_checkpoint``.
"""

import os
import tempfile

from _tiny import flawed_reward, honest_reward, prompts, quiet, tiny_policy
from trl import GRPOConfig, GRPOTrainer

from loopguard import (
    EscalationLadder,
    GoldAudit,
    Guard,
    RewardHackMitigator,
    RMEnsemble,
    read_mitigation_log,
    shape_reward,
)

quiet()
model_id, tokenizer = tiny_policy()  # SWAP: your model id, AutoTokenizer.from_pretrained(model_id)
output_dir = tempfile.mkdtemp(prefix="grpo-full-")  # SWAP: your output_dir


def second_rm(completions, **kwargs):
    """SWAP: a second, independently trained reward model (it does not share the first one's flaw)."""
    return honest_reward(completions)


def judge(prompts, completions):
    """SWAP: a held-out judge (an LLM judge, unit tests, human labels): it may be slow, it sees a sample."""
    return honest_reward(completions)


trainer = GRPOTrainer(
    model=model_id,
    reward_funcs=[
        shape_reward(flawed_reward, "repetition", strength=0.5),  # SWAP: your reward model or function
        second_rm,
    ],
    args=GRPOConfig(
        output_dir=output_dir,
        reward_weights=[1.0, 0.0],  # train on the first; the second is only watched
        beta=0.04,  # a KL term to control (GRPO's default is 0)
        save_strategy="steps",
        save_steps=20,  # trainer checkpoints: loopguard writes its state into each
        # sized for a tiny CPU run; keep your own values below
        max_steps=40,
        learning_rate=3e-2,
        num_generations=4,
        per_device_train_batch_size=16,
        max_completion_length=8,
        logging_steps=10,
        report_to=[],
        use_cpu=True,
    ),
    train_dataset=prompts(),  # SWAP: your prompt dataset
    processing_class=tokenizer,
)
guard = Guard(
    [
        *Guard().detectors,  # the defaults: repetition, diversity, length, collapse, drift
        RMEnsemble(members=("flawed_reward", "second_rm")),  # reward functions, by name
        "takeover",  # a token or phrase taking over the batch (opt-in: format rewards do it on purpose)
        GoldAudit(gold_fn=judge, every=5, sample_size=8),  # the judge scores 8 completions every 5 steps
    ],
    mode="kl_control",
    ladder=EscalationLadder(max_rollbacks=1, stop_patience=5),  # targeted penalty, 1 rollback, stop last
    warmup_steps=10,  # observed batches that set the baselines (default 20)
)
mitigator = RewardHackMitigator(
    guard=guard,
    checkpoint=os.path.join(output_dir, "rollback_checkpoints"),  # SWAP: a folder every rank can read
    checkpoint_every=5,
)
trainer.add_callback(mitigator)
trainer.train()
trainer.save_model(os.path.join(output_dir, "final"))  # after a stop, this is the last good policy

log = os.path.join(output_dir, "mitigation_log.jsonl")  # one JSON line per decision, with its explanation
decisions = [r for r in read_mitigation_log(log) if r["event"] == "decision"]
first = next((r for r in decisions if r["action"] != "none"), None)
if first is not None:
    print(f"first action: {first['explanation']}")
hacks = sum(r["verdict"] == "HACK" for r in decisions)
actions = [f"{r['step']}:{r['action']}" for r in decisions if r["action"] not in ("none", "lower_beta")]
penalty = None if guard.penalty is None else guard.penalty.describe()
print(f"full protection: {len(decisions)} decisions, {hacks} HACK; actions {actions}; "
      f"rollbacks {mitigator.rollbacks}; penalty: {penalty}; final beta {trainer.beta:.3g}")  # fmt: skip
print(f"signals: {', '.join(d.name for d in guard.detectors)}; good rollback checkpoints "
      f"{mitigator.checkpoints.good_steps()}; loopguard_state.json in "
      f"{[p for p in sorted(os.listdir(output_dir)) if p.startswith('checkpoint-')]}")  # fmt: skip
