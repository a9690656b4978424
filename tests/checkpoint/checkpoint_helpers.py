"""Tiny training setups shared by the checkpoint tests (CPU, fixed seeds, dropout so the RNG matters)."""

import random

import numpy as np
import torch


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the global generators are what checkpoints save
    torch.manual_seed(seed)


def make_mlp(seed=0):
    """A 2-layer MLP with dropout, AdamW (betas tuple, weight decay) and a LambdaLR warm-up schedule."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(16, 3)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler):
    """One step that draws from torch (inputs, dropout), numpy (targets) and python `random` (scale)."""
    model.train()
    inputs = torch.randn(8, 6)
    targets = torch.from_numpy(np.random.standard_normal((8, 3))).float() * (0.5 + random.random())  # noqa: NPY002
    loss = ((model(inputs) - targets) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return float(loss.detach())


def params(model):
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def optimizer_tensors(optimizer):
    """Every tensor in the optimizer state (exp_avg, exp_avg_sq, step) keyed by (param index, name)."""
    state = optimizer.state_dict()["state"]
    return {(index, key): value.clone() for index, entry in state.items() for key, value in entry.items()}


def assert_same_tensors(left, right):
    assert left.keys() == right.keys()
    for key in left:
        assert left[key].dtype == right[key].dtype, key
        assert torch.equal(left[key], right[key]), key


def two_step_store(folder):
    """A store in ``folder`` with steps 5 and 10 saved (every part: reference, rollout buffer, extra state),
    step 5 marked good, and the live run's ``(model, optimizer, scheduler, ref_model)``."""
    import torch

    from loopguard.checkpoint import CheckpointManager

    model, optimizer, scheduler = make_mlp(0)
    ref_model, _, _ = make_mlp(1)
    manager = CheckpointManager(folder)
    for step in (5, 10):
        train_step(model, optimizer, scheduler)
        manager.save(
            step,
            model,
            optimizer,
            scheduler,
            ref_model=ref_model,
            rollout_buffer={"ids": torch.arange(6), "note": "x"},
            extra_state={"step": step},
        )
    manager.mark_good(5)
    return manager, (model, optimizer, scheduler, ref_model)
