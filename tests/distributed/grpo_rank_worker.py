"""One rank of the 2-process GRPO test (launched by test_rank_sync.py with torch.distributed.run, gloo, CPU).

Only rank 1's *local* data carries the hack: from step ``HACK_FROM`` its tapped reward function records
``"x x x x x x x x"`` completions (a rank-local tap, as on a real multi-GPU run where one rank's slice
holds the hacked samples). Rank 0's tap sees healthy text. The mitigator must take the same action with the
same beta on both ranks at every step, and its rollback must leave both ranks with the checkpoint's weights.
The trainer's padded completion ids, as :class:`IdCapture` reads them inside the generation step, are
gathered from both ranks: each rank records what it holds after every step.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node 2 grpo_rank_worker.py OUT [nosync]``;
``nosync`` disables the rank synchronisation (to show that the test catches its absence); each rank then
also keeps its own rollback store (without the broadcast, each rank starts its own run identity, and a store
belongs to one run).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HACK_FROM = 5


def digest(model):
    """SHA-256 over every parameter's bytes, in name order."""
    hasher = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        hasher.update(name.encode())
        hasher.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return hasher.hexdigest()


class Recorder:
    """Added after the mitigator: what it decided and the trainer's beta, and the weights after a rollback."""

    def __init__(self, mitigator):
        self.mitigator = mitigator
        self.trainer = None
        self.capture = None
        self.steps = {}
        self.after_rollback = {}
        self.ids = {}

    def on_step_end(self, args, state, control, **kwargs):
        decision = self.mitigator.last_decision
        step = int(state.global_step)
        self.steps[step] = {
            "action": None if decision is None or decision.step != step else decision.action,
            "beta": float(self.trainer.beta),
        }
        if self.mitigator.rollbacks and self.mitigator.rollbacks[-1]["step"] == step:
            self.after_rollback[step] = digest(self.trainer.model)
        latest = self.capture.latest
        if latest is not None:  # the generation step's ids, gathered over both ranks, in the logs' order
            rows = latest.ids[latest.mask != 0]
            self.ids[step] = {
                "rows": int(latest.ids.shape[0]),
                "tokens": int(latest.mask.sum()),
                "digest": hashlib.sha256(rows.astype("int64").tobytes()).hexdigest(),
            }


def main():
    """Run one rank (imports here: pytest's doctest collection imports this file without running it)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "adapters"))
    import torch

    torch.set_num_threads(1)
    from adapter_helpers import build_tokenizer, gold, grpo_trainer, save_tiny_model
    from transformers import TrainerCallback

    from loopguard import EscalationLadder, Guard, RewardHackMitigator, tap
    from loopguard.adapters._distributed import RankSync
    from loopguard.adapters._observe import IdCapture
    from loopguard.checkpoint import CheckpointManager

    out, nosync = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "nosync"
    if nosync:
        RankSync.active = property(lambda self: False)  # the reduction removed: ranks decide alone
    rank = int(os.environ["RANK"])
    shared = os.path.join(out, "shared")
    model_dir = os.path.join(shared, "model")
    tokenizer = build_tokenizer()
    if rank == 0:  # written aside, then renamed: another rank never sees a half-written folder
        save_tiny_model(model_dir + ".tmp", tokenizer)
        os.rename(model_dir + ".tmp", model_dir)

    def echo_reward(completions, **kwargs):
        return gold(completions)

    tapped = tap(echo_reward)
    x_id = tokenizer.convert_tokens_to_ids("x")

    def reward(completions, completion_ids, trainer_state=None, **kwargs):
        step = 0 if trainer_state is None else int(trainer_state.global_step)
        if rank == 1 and step >= HACK_FROM:  # what the tap records on rank 1 only
            completions = ["x x x x x x x x"] * len(completions)
            completion_ids = [[x_id] * 8 for _ in completion_ids]
        return tapped(
            completions=completions, completion_ids=completion_ids, trainer_state=trainer_state, **kwargs
        )

    store = os.path.join(shared, f"store-rank{rank}" if nosync else "store")
    mitigator = RewardHackMitigator(
        guard=Guard(
            mode="kl_control",
            ladder=EscalationLadder(
                rollback_patience=2, stop_patience=50, max_rollbacks=1, cooldown_steps=50
            ),
            warmup_steps=3,
        ),
        checkpoint=store,
        checkpoint_every=2,
        taps=[tapped],
        group_size=4,
    )
    recorder = type("Recorder", (Recorder, TrainerCallback), {})(mitigator)
    import torch.distributed as dist

    # the model folder must exist before another rank loads it (the trainer initialises the process group)
    while not os.path.isdir(model_dir):
        time.sleep(0.1)
    trainer = grpo_trainer(
        model_dir,
        tokenizer,
        os.path.join(out, f"run{rank}"),
        [reward],
        callbacks=[mitigator, recorder],
        max_steps=8,
        per_device_train_batch_size=8,
        beta=0.01,
    )
    recorder.trainer = trainer
    recorder.capture = IdCapture.install(trainer)
    trainer.train()
    lengths = {
        str(entry["step"]): entry["completions/mean_length"]
        for entry in trainer.state.log_history
        if "completions/mean_length" in entry
    }
    result = {
        "ids": recorder.ids,
        "trl_mean_length": lengths,
        "steps": recorder.steps,
        "rollbacks": mitigator.rollbacks,
        "after_rollback": recorder.after_rollback,
        "final": digest(trainer.model),
        "collectives": mitigator._sync.collectives,
    }
    dist.barrier()
    if mitigator.rollbacks:
        restored = mitigator.rollbacks[0]["restored_step"]
        model = type(trainer.model).from_pretrained(model_dir)
        CheckpointManager(store).restore(restored, model, rng=False)
        result["checkpoint"] = digest(model)
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    from launch_helpers import leave

    main()
    leave()  # the result is written: skip the exit-time teardown that can abort a finished rank
