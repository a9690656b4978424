"""GRPO on a LoRA (PEFT) policy: the same callback, and rollback checkpoints that hold only the adapter.

Run:  python examples/recipes/grpo_lora.py

With ``peft_config`` TRL trains a LoRA adapter and uses the base model with the adapter disabled as the KL
reference (no second copy of the model). loopguard's rollback checkpoints hold only the adapter's weights
and its optimizer state: about 25 MiB for LoRA r=16 on a 0.5B model's attention, 116 MiB on a 7B one
(``python benchmarks/rollback_store.py``). Keep them in memory by naming the store: the one-liner's own rule
estimates a checkpoint from every parameter, the frozen base included, and so puts the store on disk from a
0.5B bfloat16 base on (docs/recipes.md, "What will it cost me"). A rollback restores
the adapter; it cannot re-anchor the KL reference on the restored policy (the reference is the base model),
so tell the ladder ``reanchor=False`` (otherwise a warning at the start of training says so).
"""

import os
import tempfile

from _tiny import flawed_reward, prompts, quiet, tiny_policy
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

from loopguard import EscalationLadder, Guard, RewardHackMitigator, read_mitigation_log

quiet()
model_id, tokenizer = tiny_policy(initializer_range=0.2)  # SWAP: your model id and its tokenizer
output_dir = tempfile.mkdtemp(prefix="grpo-lora-")  # SWAP: your output_dir

trainer = GRPOTrainer(
    model=model_id,
    reward_funcs=flawed_reward,  # SWAP: your reward model or reward functions
    args=GRPOConfig(
        output_dir=output_dir,
        beta=0.04,
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
    peft_config=LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["c_attn", "c_proj", "c_fc"],  # SWAP: e.g. ["q_proj", "v_proj"] for Llama or Qwen
        task_type="CAUSAL_LM",
    ),
)
# its own rollback store keeps only the adapter (and its optimizer state): in memory in one process
mitigator = RewardHackMitigator(guard=Guard(mode="kl_control", ladder=EscalationLadder(reanchor=False)))
trainer.add_callback(mitigator)
trainer.train()

trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
total = sum(p.numel() for p in trainer.model.parameters())
log = os.path.join(output_dir, "mitigation_log.jsonl")
decisions = [r for r in read_mitigation_log(log) if r["event"] == "decision"]
hacks = sum(r["verdict"] == "HACK" for r in decisions)
actions = [f"{r['step']}:{r['action']}" for r in decisions if r["action"] not in ("none", "lower_beta")]
print(f"LoRA: {type(trainer.model).__name__}, {trainable} of {total} parameters trained; "
      f"rollback store {mitigator.checkpoints}, checkpoints {mitigator.checkpoints.steps()}")  # fmt: skip
print(f"LoRA: {len(decisions)} decisions, {hacks} HACK; actions {actions}; rollbacks {mitigator.rollbacks}; "
      f"final beta {trainer.beta:.3g}")  # fmt: skip
