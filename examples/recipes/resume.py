"""Resuming a guarded run: ``resume_from_checkpoint`` brings loopguard's state back too.

Run:  python examples/recipes/resume.py

At every trainer checkpoint (``save_strategy``/``save_steps``) the mitigator writes ``loopguard_state.json``
(the Guard's baselines, smoothing windows, controller and ladder, the raised beta, the rollbacks) and
``loopguard_run.json`` (the run's identity) into ``checkpoint-N``. Resuming reads them back before the first
resumed step: beta is the raised one (TRL alone would reset it to ``args.beta``), the warm-up and baselines
continue, and it is the same run (the same rollback store, one timeline in the mitigation log). Build the
trainer and the mitigator as before, then call ``trainer.train(resume_from_checkpoint=True)``.

One thing to choose: where the rollback checkpoints live. The store ``RewardHackMitigator()`` makes for
itself is in memory for a small model trained by one process, and memory does not survive a restart: the
resumed run would have no rollback target until a new checkpoint is saved and confirmed. Name a folder
(``checkpoint=...``) and the resumed run keeps the good checkpoints saved before the restart (those saved
after the resume point belong to the abandoned timeline and are discarded).

This script trains 20 steps with a checkpoint every 10, then, as a restarted job would, builds everything
anew and resumes from the newest checkpoint for 10 more steps.
"""

import json
import os
import tempfile

from _tiny import flawed_reward, prompts, quiet, tiny_policy
from trl import GRPOConfig, GRPOTrainer

from loopguard import RewardHackMitigator, read_mitigation_log

quiet()
model_id, tokenizer = tiny_policy()  # SWAP: your model id, AutoTokenizer.from_pretrained(model_id)
output_dir = tempfile.mkdtemp(prefix="grpo-resume-")  # SWAP: your output_dir (the same one on restart)


def build(max_steps):
    """What your training script does on every start, a restart included."""
    trainer = GRPOTrainer(
        model=model_id,
        reward_funcs=flawed_reward,  # SWAP: your reward model or reward functions
        args=GRPOConfig(
            output_dir=output_dir,
            beta=0.04,
            save_strategy="steps",
            save_steps=10,  # loopguard's state goes into every checkpoint-N
            # sized for a tiny CPU run; keep your own values below
            max_steps=max_steps,
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
    mitigator = RewardHackMitigator(checkpoint=os.path.join(output_dir, "rollback_checkpoints"))
    trainer.add_callback(mitigator)
    return trainer, mitigator


first, first_mitigator = build(max_steps=20)
first.train()  # the job "dies" after step 20
with open(os.path.join(output_dir, "checkpoint-20", "loopguard_state.json"), encoding="utf-8") as handle:
    saved = json.load(handle)
print(f"saved at step 20: run {saved['run']}, beta {saved['beta']:.4g}, {saved['guard']['seen']} batches "
      f"seen; good rollback checkpoints {first_mitigator.checkpoints.good_steps()}")  # fmt: skip

resumed, resumed_mitigator = build(max_steps=30)  # the restarted job: the same script, the same output_dir
resumed.train(resume_from_checkpoint=True)  # the newest checkpoint-N in output_dir
records = read_mitigation_log(os.path.join(output_dir, "mitigation_log.jsonl"))
resume = next(r for r in records if r["event"] == "resume")
step_21 = next(r for r in records if r["event"] == "decision" and r["step"] == 21)
print(f"resumed at step {resume['step']}: run {resumed_mitigator.run_id}, beta at step 21 "
      f"{step_21['beta_before']:.4g} (args.beta is 0.04), {resumed_mitigator.guard.state_dict()['seen']} "
      f"batches seen after step 30; good rollback checkpoints "
      f"{resumed_mitigator.checkpoints.good_steps()}")  # fmt: skip
