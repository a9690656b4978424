"""A plain PyTorch RL loop (no trainer library) guarded by ``LoopGuard``.

Run:  python examples/recipes/raw_loop.py

Your loop owns its KL coefficient, its model and its optimizer, so loopguard hands each decision back to it:
once per step, after ``optimizer.step()``, build an ``Observation`` (the raw rewards, the completions, the
group size, the measured KL) and call ``loop.step(...)``. ``LoopGuard`` asks the Guard, writes the new beta
through your ``set_beta``, saves rollback checkpoints while the run is healthy (``checkpoint_every``),
restores the last good one on a rollback (and re-anchors your KL reference on it), and tells you to stop.
Once the ladder switches a targeted penalty on, ``loop.guard.penalty(completion_ids)`` is what to subtract
from the rewards you train on; keep giving the Guard the raw ones. Under ``torchrun`` the same code gives
every rank the same decision (see ``docs/loops.md``).

The policy is REINFORCE with a group-mean baseline and a KL penalty to a frozen copy of the start.
"""

import copy

import torch
from _tiny import flawed_reward, honest_reward, quiet, tiny_policy
from transformers import AutoModelForCausalLM

from loopguard import EscalationLadder, Guard, LoopGuard, Observation
from loopguard.checkpoint import CheckpointManager

quiet()
torch.manual_seed(0)
model_id, tokenizer = tiny_policy()  # SWAP: your model id, AutoTokenizer.from_pretrained(model_id)
policy = AutoModelForCausalLM.from_pretrained(model_id)
reference = copy.deepcopy(policy).requires_grad_(False).eval()  # the KL reference: the starting policy
optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-2)  # SWAP: your optimizer and learning rate
PROMPTS, GROUP, NEW_TOKENS, STEPS = 4, 4, 8, 40  # prompts per step, completions per prompt

beta = [0.04]  # the loop's KL coefficient: the Guard writes it through set_beta
loop = LoopGuard(
    Guard(
        mode="kl_control",
        beta=beta[0],
        warmup_steps=10,  # observed steps that set the baselines (default 20)
        advantage_scale=1.0,  # the loop normalises advantages per group (sizes the first raise of beta)
        ladder=EscalationLadder(max_rollbacks=1),  # targeted penalty, one rollback, stop last
    ),
    set_beta=lambda value: beta.__setitem__(0, value),
    checkpoint=CheckpointManager(in_memory=True, keep_last=3),  # or a folder: CheckpointManager("ckpts")
    checkpoint_every=5,  # saved while healthy, marked good once the Guard confirms it
)
loop.save_start(policy, optimizer=optimizer)  # the starting policy: a good rollback target from step 0


def token_logps(model, sequences, width):
    logits = model(sequences).logits[:, width - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(-1, sequences[:, width:, None]).squeeze(-1)


for step in range(1, STEPS + 1):
    prompts = [f"w{(step * PROMPTS + i) % 23} w{(step * PROMPTS + i) % 23 + 1}" for i in range(PROMPTS)]
    batch = tokenizer(prompts, return_tensors="pt", add_special_tokens=False)  # SWAP: your prompts
    width = batch["input_ids"].shape[1]
    with torch.no_grad():
        sequences = policy.generate(
            **batch, do_sample=True, top_k=0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
            num_return_sequences=GROUP, pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
    completion_ids = sequences[:, width:]
    completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    rewards = torch.tensor(flawed_reward(completions))  # SWAP: your reward model; the raw reward
    penalty = loop.guard.penalty  # None until the ladder switches its targeted penalty on
    trained = rewards
    if penalty is not None:  # train on the penalised reward; the Guard keeps reading the raw one
        trained = rewards - torch.tensor(penalty(completion_ids.tolist()), dtype=torch.float32)
    grouped = trained.view(PROMPTS, GROUP)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-4)
    advantages = advantages.view(-1)

    logps = token_logps(policy, sequences, width)
    with torch.no_grad():
        ref_logps = token_logps(reference, sequences, width)
    log_ratio = ref_logps - logps
    kl = (log_ratio.exp() - log_ratio - 1).mean()  # per-token KL (the k3 estimator, as in GRPO)
    loss = -(advantages[:, None] * logps).mean() + beta[0] * kl
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    observation = Observation(
        step,
        rewards.tolist(),  # raw, before the penalty
        completions=completions,
        completion_ids=completion_ids.tolist(),
        group_size=GROUP,
        kl=float(kl.detach()),
        beta=beta[0],
    )
    applied = loop.step(observation, model=policy, optimizer=optimizer, reference=reference)
    if applied.action not in ("none", "lower_beta"):
        back = "" if applied.rolled_back_to is None else f", rolled back to step {applied.rolled_back_to}"
        print(f"step {step}: {applied.action}, beta now {beta[0]:.3g}{back}")
    if penalty is None and loop.guard.penalty is not None:
        print(f"step {step}: targeted penalty on: {loop.guard.penalty.describe()}")
    if applied.stop:
        print(f"stopped at step {step}: {applied.decision.explanation}")
        break

print(f"raw loop: {step} steps, beta {beta[0]:.3g}, rollbacks {loop.rollbacks}, "
      f"penalty {loop.guard.penalty.describe() if loop.guard.penalty else None}; "
      f"gold of the last batch {sum(honest_reward(completions)) / len(completions):.3f}")  # fmt: skip
