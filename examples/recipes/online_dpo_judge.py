"""Online DPO with a judge: tap the judge, so loopguard sees what it scored.

Run:  python examples/recipes/online_dpo_judge.py

TRL's ``OnlineDPOTrainer`` (``trl.experimental.online_dpo``) generates two completions per prompt, scores
them with its reward functions (your judge) and trains on the preferred one. It keeps only the mean score,
so without help loopguard would see neither the completions nor the scores, and no signal could vote.
Wrap the judge with ``loopguard.tap`` (same name, same outputs, sync or async): the mitigator finds the tapped
function among ``trainer.reward_funcs`` and reads every call, and the repetition and diversity signals can
vote. Online DPO's KL coefficient lives in ``trainer._beta``; loopguard writes it there. The two completions
of a prompt are not a GRPO group: leave ``group_size`` unset.
"""

import os
import tempfile

from _tiny import flawed_reward, prompts, quiet, tiny_policy
from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

import loopguard
from loopguard import EscalationLadder, Guard, RewardHackMitigator, read_mitigation_log

quiet()
model_id, tokenizer = tiny_policy()  # SWAP: your model id, AutoTokenizer.from_pretrained(model_id)
output_dir = tempfile.mkdtemp(prefix="online-dpo-")  # SWAP: your output_dir


def judge(prompts, completions, **kwargs):
    """SWAP: your judge or reward model. This one has a flaw: it prefers completions full of ``x``."""
    return flawed_reward(completions)


tapped_judge = loopguard.tap(judge)  # <- loopguard reads every call
trainer = OnlineDPOTrainer(
    model=model_id,
    reward_funcs=[tapped_judge],
    args=OnlineDPOConfig(
        output_dir=output_dir,
        beta=0.1,
        # sized for a tiny CPU run; keep your own values below
        max_steps=30,
        learning_rate=3e-2,
        per_device_train_batch_size=8,
        max_new_tokens=8,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
    ),
    train_dataset=prompts(),  # SWAP: your prompt dataset
    processing_class=tokenizer,
)
mitigator = RewardHackMitigator(
    guard=Guard(
        mode="kl_control",
        ladder=EscalationLadder(),  # targeted penalty, rollback, stop last
        warmup_steps=5,  # observed batches that set the baselines (default 20; shortened for 30 steps)
    )
)
trainer.add_callback(mitigator)
trainer.train()

log = os.path.join(output_dir, "mitigation_log.jsonl")
decisions = [r for r in read_mitigation_log(log) if r["event"] == "decision"]
sources = sorted({r["extra"]["adapter"]["source"] for r in decisions})
hacks = sum(r["verdict"] == "HACK" for r in decisions)
actions = [f"{r['step']}:{r['action']}" for r in decisions if r["action"] not in ("none", "lower_beta")]
first = next((r for r in decisions if r["verdict"] == "HACK"), None)
if first is not None:
    print(f"first HACK: {first['explanation']}")
top = max(r["beta_after"] for r in decisions)
print(f"online DPO: {len(decisions)} decisions read from {sources}, {hacks} HACK; actions {actions}; "
      f"rollbacks {mitigator.rollbacks}; beta up to {top:.3g}, final beta {trainer.beta:.3g}")  # fmt: skip
print(f"the tap recorded {len(tapped_judge.records())} judge calls "
      f"of {len(tapped_judge.records()[-1].rewards)} completions each")  # fmt: skip
