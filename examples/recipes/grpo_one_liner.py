"""GRPO with a flawed reward model: the one line that protects the run.

Run:  python examples/recipes/grpo_one_liner.py

``trainer.add_callback(RewardHackMitigator())`` is all you add to a TRL ``GRPOTrainer`` script. With every
default it watches each generation batch (repetition, diversity, length, collapse, reward drift), and when
the reward is being gamed it raises beta (sized from the measured KL), switches a targeted penalty on the
feature the reward pays for, rolls back to the last good policy (its own store: in memory for a small model
in one process, else on disk in ``output_dir``) and, last, stops with the good policy restored. The one
thing it needs from your config is a KL term to control: ``beta > 0`` (GRPO's default is 0).

The reward here has a bug (it pays 0.5 for every ``x``), and the tiny policy learns to write ``x x x ...``.
"""

import os
import tempfile

from _tiny import flawed_reward, prompts, quiet, tiny_policy
from trl import GRPOConfig, GRPOTrainer

from loopguard import RewardHackMitigator, read_mitigation_log

quiet()
model_id, tokenizer = tiny_policy()  # SWAP: your model id, AutoTokenizer.from_pretrained(model_id)
output_dir = tempfile.mkdtemp(prefix="grpo-one-liner-")  # SWAP: your output_dir

trainer = GRPOTrainer(
    model=model_id,
    reward_funcs=flawed_reward,  # SWAP: your reward model or reward functions
    args=GRPOConfig(
        output_dir=output_dir,
        beta=0.04,  # loopguard needs a KL term to control: GRPO's default beta is 0
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
trainer.add_callback(RewardHackMitigator())  # <- the one line
trainer.train()

# What loopguard did. Its metrics (loopguard/beta, loopguard/verdict, ...) are in the trainer's logs, so
# report_to sends them to TensorBoard, W&B or trackio; every decision, with its explanation in plain
# English, is one line of output_dir/mitigation_log.jsonl (`loopguard report` summarises it).
last = [logs for logs in trainer.state.log_history if "loopguard/beta" in logs][-1]
keys = ("loopguard/beta", "loopguard/verdict", "loopguard/action", "loopguard/rollbacks")
print(f"logged at step {last['step']}: " + ", ".join(f"{key} {last[key]:.3g}" for key in keys))
log = os.path.join(output_dir, "mitigation_log.jsonl")
decisions = [r for r in read_mitigation_log(log) if r["event"] == "decision"]
first = next((r for r in decisions if r["action"] != "none"), None)
if first is not None:
    print(f"first action: {first['explanation']}")
hacks = sum(r["verdict"] == "HACK" for r in decisions)
actions = [f"{r['step']}:{r['action']}" for r in decisions if r["action"] != "none"]
print(f"one-liner: {len(decisions)} decisions, {hacks} HACK; actions {actions}; beta {trainer.beta:.3g}")
