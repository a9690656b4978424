"""Several GPUs (or CPU processes): the same script, launched with ``torchrun`` or ``accelerate launch``.

Run:  torchrun --nproc_per_node 2 examples/recipes/multi_gpu.py [--output-dir DIR]
      accelerate launch --num_processes 2 examples/recipes/multi_gpu.py [--output-dir DIR]   (on 2 GPUs)

Without GPUs, ``torchrun`` runs the 2 processes on the CPU with the gloo backend (the test does this);
``accelerate launch --cpu`` would start only one process. ``python examples/recipes/multi_gpu.py`` is a
single process (no collectives at all).

Nothing in the mitigator changes: when ``torch.distributed`` is initialised it gives every rank the same
decision at the same step (the most alarmed rank wins; its Guard state is broadcast as JSON), so every rank
writes the same beta, rolls back together and stops together. What you provide:

* an ``output_dir`` every rank can read (a shared filesystem on several nodes): with several processes the
  mitigator's own rollback store is on disk, in ``<output_dir>/loopguard_checkpoints/<run>``; rank 0 saves,
  every rank restores;
* the same script on every rank, so each adds the same callback.

The mitigation log and ``loopguard_state.json`` are written by rank 0 only. Each rank makes one line at the
end (its beta, rollbacks and a digest of its weights), and rank 0 prints them all: they agree.
"""

import argparse
import gc
import hashlib
import json
import os
import tempfile

import torch
from _tiny import flawed_reward, prompts, quiet, tiny_policy
from accelerate.utils import gather_object
from trl import GRPOConfig, GRPOTrainer

from loopguard import RewardHackMitigator, read_mitigation_log

parser = argparse.ArgumentParser()
parser.add_argument("--output-dir", default=os.path.join(tempfile.gettempdir(), "loopguard-multi-gpu"))
output_dir = parser.parse_args().output_dir  # SWAP: your output_dir, on a filesystem every rank can read
quiet()
model_id, tokenizer = tiny_policy()  # SWAP: your model id, AutoTokenizer.from_pretrained(model_id)

trainer = GRPOTrainer(
    model=model_id,
    reward_funcs=flawed_reward,  # SWAP: your reward model or reward functions
    args=GRPOConfig(
        output_dir=output_dir,
        beta=0.04,
        use_cpu=not torch.cuda.is_available(),  # only for this CPU demonstration: drop it on GPUs
        # sized for a tiny CPU run; keep your own values below (8 per process x 2 processes = 16)
        max_steps=20,
        learning_rate=3e-2,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
    ),
    train_dataset=prompts(),  # SWAP: your prompt dataset
    processing_class=tokenizer,
)
mitigator = RewardHackMitigator()
trainer.add_callback(mitigator)
trainer.train()

# Every rank ends with the same beta, Guard state (baselines, controller, ladder) and weights.
weights = hashlib.sha256()
for name, tensor in sorted(trainer.model.state_dict().items()):
    weights.update(name.encode() + tensor.detach().cpu().contiguous().numpy().tobytes())
guard_state = hashlib.sha256(json.dumps(mitigator.guard.state_dict(), sort_keys=True).encode()).hexdigest()
rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
line = (
    f"rank {rank} of {world}: run {mitigator.run_id}, final beta {trainer.beta:.6g}, rollbacks "
    f"{mitigator.rollbacks}, guard state {guard_state[:16]}, weights {weights.hexdigest()[:16]}"
)
# Every rank's line, printed by rank 0: two processes writing one stdout can split each other's lines.
lines = gather_object([line])
if trainer.accelerator.is_main_process:
    print("\n".join(lines), flush=True)
    decisions = [
        r for r in read_mitigation_log(os.path.join(output_dir, "mitigation_log.jsonl"))
        if r["event"] == "decision" and r["run"] == mitigator.run_id
    ]  # fmt: skip
    acted = [f"{r['step']}:{r['action']}" for r in decisions if r["action"] != "none"]
    print(f"mitigation log (rank 0): {len(decisions)} decisions, actions {acted}; "
          f"rollback store {mitigator.checkpoints}")  # fmt: skip
# End the process group before Python exits: gloo's worker threads still running at the interpreter's teardown
# can abort a finished rank (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#179291).
# The trainer (its DDP-wrapped model) keeps the process group alive, and the mitigator holds the trainer: let
# both go first, or destroying the process group leaves its threads running.
accelerator = trainer.accelerator
del trainer, mitigator
gc.collect()
accelerator.end_training()
