"""ReferenceAdapter: a LoRA policy's KL reference in a hand-written loop, re-anchored by a rollback.

A real PEFT LoRA policy (the tiny GPT-2), trained by a plain PyTorch loop, checkpointed and rolled back by
loopguard's CheckpointManager and apply_decision.
"""

import re

import attrs
import pytest
import torch
from adapter_helpers import fresh_model

from loopguard import Guard, Observation, ReferenceAdapter, apply_decision
from loopguard.checkpoint import CheckpointManager
from loopguard.exceptions import ConfigError, LoopguardTypeError

peft = pytest.importorskip("peft")


def lora_policy(model_dir, r=4):
    config = peft.LoraConfig(
        r=r, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn"], task_type="CAUSAL_LM"
    )
    return peft.get_peft_model(fresh_model(model_dir), config)


def train(model, optimizer, ids, steps):
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(ids, labels=ids).loss.backward()
        optimizer.step()


def logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(ids).logits


def reference_logits(reference, ids):
    reference.model.eval()
    with reference.active():
        out = reference.model(ids).logits
    assert not out.requires_grad  # the reference pass runs without autograd
    return out


def test_a_rollback_re_anchors_the_reference_adapter_on_the_restored_policy(model_dir):
    torch.manual_seed(0)
    model = lora_policy(model_dir)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
    ids = torch.randint(3, model.config.vocab_size, (2, 12))
    with model.disable_adapter():
        base = logits(model, ids)

    reference = ReferenceAdapter(model)
    assert reference.added
    assert list(model.peft_config) == ["default", "ref"]
    assert {name for name, p in model.named_parameters() if p.requires_grad} == trainable  # "ref" is frozen
    assert model.active_adapter == "default"

    manager = CheckpointManager(in_memory=True)
    train(model, optimizer, ids, 3)
    manager.save(3, model, optimizer)
    manager.mark_good(3)
    good = logits(model, ids)
    assert not torch.allclose(good, base, atol=1e-4)  # the policy moved away from the base model
    assert torch.equal(reference_logits(reference, ids), base)  # the reference is still the base, exactly
    assert model.active_adapter == "default"
    assert {name for name, p in model.named_parameters() if p.requires_grad} == trainable

    train(model, optimizer, ids, 3)  # the policy moves on past the good checkpoint
    assert not torch.allclose(logits(model, ids), good, atol=1e-4)
    decision = Guard(mode="kl_control", warmup_steps=3, beta=0.1).step(Observation(0, [1.0, 0.0, 0.5, 0.2]))
    kept = attrs.evolve(decision, step=9, action="rollback", restore_before=9, reanchor=False)
    applied = apply_decision(kept, checkpoint=manager, model=model, optimizer=optimizer, reference=reference)
    assert applied.rolled_back_to == 3
    assert not applied.reanchored
    assert torch.allclose(logits(model, ids), good, atol=1e-6)
    assert torch.equal(reference_logits(reference, ids), base)  # re-anchoring off: the reference stays

    train(model, optimizer, ids, 2)
    rollback = attrs.evolve(kept, reanchor=True)
    applied = apply_decision(
        rollback, checkpoint=manager, model=model, optimizer=optimizer, reference=reference
    )
    assert applied.rolled_back_to == 3
    assert applied.reanchored
    restored = logits(model, ids)
    assert torch.allclose(restored, good, atol=1e-6)
    assert torch.allclose(reference_logits(reference, ids), restored, atol=1e-6)  # the reference moved
    assert {name for name, p in model.named_parameters() if p.requires_grad} == trainable

    train(model, optimizer, ids, 2)  # training goes on from the restored policy; the reference holds
    assert torch.allclose(reference_logits(reference, ids), restored, atol=1e-6)
    assert not torch.allclose(logits(model, ids), restored, atol=1e-4)

    assert reference.remove()
    assert list(model.peft_config) == ["default"]
    assert model.active_adapter == "default"
    assert not reference.remove()


def test_an_existing_reference_adapter_is_used_and_left_in_place(model_dir):
    model = lora_policy(model_dir)
    first = ReferenceAdapter(model)
    second = ReferenceAdapter(model)  # TRL's "ref", or one made earlier: used as it is
    assert first.added
    assert not second.added
    assert not second.remove()
    assert "ref" in model.peft_config


def test_bad_policies_and_names_are_refused_with_the_rule(model_dir):
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`model` must be a peft.PeftModel with a LoRA adapter")
    ):
        ReferenceAdapter(torch.nn.Linear(2, 2))
    model = lora_policy(model_dir)
    with pytest.raises(ConfigError, match=re.escape("`name` must differ from the trained adapter 'default'")):
        ReferenceAdapter(model, name="default")
    with pytest.raises(ConfigError, match=re.escape("`adapter` must name a LoRA adapter of the policy")):
        ReferenceAdapter(model, adapter="missing")
    other = peft.LoraConfig(r=8, lora_alpha=8, target_modules=["c_attn"], task_type="CAUSAL_LM")
    model.add_adapter("ref", other)
    model.set_adapter("default")
    with pytest.raises(ConfigError, match=re.escape("must hold the same tensors as 'default'")):
        ReferenceAdapter(model)
    assert list(model.peft_config) == ["default", "ref"]  # nothing was changed
