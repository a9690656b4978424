"""RLOO with a flawed reward model: the same one line as GRPO.

Run:  python examples/recipes/rloo.py

TRL's ``RLOOTrainer`` keeps the same logs as ``GRPOTrainer`` and its KL coefficient in ``trainer.beta`` too
(default 0.05, so nothing to configure). RLOO subtracts ``beta * KL`` from the reward before its
leave-one-out baseline, so a beta that loopguard raises applies from the next generation on.
"""

import os
import tempfile

from _tiny import flawed_reward, prompts, quiet, tiny_policy
from trl import RLOOConfig, RLOOTrainer

from loopguard import RewardHackMitigator, read_mitigation_log

quiet()
model_id, tokenizer = tiny_policy()  # SWAP: your model id, AutoTokenizer.from_pretrained(model_id)
output_dir = tempfile.mkdtemp(prefix="rloo-")  # SWAP: your output_dir

trainer = RLOOTrainer(
    model=model_id,
    reward_funcs=flawed_reward,  # SWAP: your reward model or reward functions
    args=RLOOConfig(
        output_dir=output_dir,
        beta=0.05,  # RLOO's default; loopguard raises it while a hack lasts, never below this value
        # sized for a tiny CPU run; keep your own values below
        max_steps=30,
        learning_rate=3e-2,
        num_generations=4,
        per_device_train_batch_size=16,
        max_completion_length=8,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
    ),
    train_dataset=prompts(),  # SWAP: your prompt dataset
    processing_class=tokenizer,
)
mitigator = RewardHackMitigator()
trainer.add_callback(mitigator)
trainer.train()

log = os.path.join(output_dir, "mitigation_log.jsonl")
decisions = [r for r in read_mitigation_log(log) if r["event"] == "decision"]
hacks = sum(r["verdict"] == "HACK" for r in decisions)
actions = [f"{r['step']}:{r['action']}" for r in decisions if r["action"] not in ("none", "lower_beta")]
print(f"RLOO: {len(decisions)} decisions, {hacks} HACK; actions {actions}; rollbacks {mitigator.rollbacks}; "
      f"max beta {max(r['beta_after'] for r in decisions):.3g}, final beta {trainer.beta:.3g}")  # fmt: skip
