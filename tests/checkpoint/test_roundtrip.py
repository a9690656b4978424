"""Round trips: a restored run continues bit-identically; HF and PEFT models, buffers, JSON state, RNGs."""

import json
import random

import numpy as np
import pytest
import safetensors.torch
import torch
from checkpoint_helpers import (
    assert_same_tensors,
    make_mlp,
    optimizer_tensors,
    params,
    seed_everything,
    train_step,
)

from loopguard import Guard
from loopguard.checkpoint import CheckpointError, CheckpointManager


def _manager(kind, tmp_path, **kwargs):
    if kind == "disk":
        return CheckpointManager(tmp_path / "store", **kwargs)
    return CheckpointManager(in_memory=True, **kwargs)


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_continuation_after_restore_is_bit_identical(kind, tmp_path):
    # Uninterrupted run: 3 steps, save at step 3, 3 more steps.
    seed_everything(0)
    model, optimizer, scheduler = make_mlp(0)
    for _ in range(3):
        train_step(model, optimizer, scheduler)
    manager = _manager(kind, tmp_path)
    manager.save(3, model, optimizer, scheduler)
    for _ in range(3):
        train_step(model, optimizer, scheduler)
    expected_params, expected_moments = params(model), optimizer_tensors(optimizer)
    expected_lr = optimizer.param_groups[0]["lr"]
    expected_scheduler = scheduler.state_dict()

    # Resumed run: a freshly built model with another init and RNGs elsewhere, restored, then the same 3 steps.
    seed_everything(123)
    model2, optimizer2, scheduler2 = make_mlp(seed=99)
    train_step(model2, optimizer2, scheduler2)  # drift the fresh objects away from the checkpoint
    restored = manager.restore(3, model2, optimizer2, scheduler2)
    assert restored.step == 3
    for _ in range(3):
        train_step(model2, optimizer2, scheduler2)

    assert_same_tensors(params(model2), expected_params)
    moments = optimizer_tensors(optimizer2)
    assert {key[1] for key in moments} == {"exp_avg", "exp_avg_sq", "step"}
    assert_same_tensors(moments, expected_moments)
    assert optimizer2.param_groups[0]["lr"] == expected_lr
    assert optimizer2.param_groups[0]["betas"] == (0.9, 0.95)
    assert scheduler2.state_dict() == expected_scheduler


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_rng_states_are_restored(kind, tmp_path, mlp):
    model, _optimizer, _ = mlp
    manager = _manager(kind, tmp_path)
    manager.save(1, model)
    expected = (random.random(), np.random.random(), torch.rand(3))  # noqa: NPY002
    random.seed(5)
    np.random.seed(5)  # noqa: NPY002
    torch.manual_seed(5)
    manager.restore(1, model)
    again = (random.random(), np.random.random(), torch.rand(3))  # noqa: NPY002
    assert again[0] == expected[0]
    assert again[1] == expected[1]
    assert torch.equal(again[2], expected[2])


def test_rng_false_leaves_generators_alone(tmp_path, mlp):
    model, _, _ = mlp
    manager = CheckpointManager(tmp_path)
    manager.save(1, model, rng=False)
    torch.manual_seed(7)
    expected = torch.rand(2)
    torch.manual_seed(7)
    manager.restore(1, model, rng=False)
    assert torch.equal(torch.rand(2), expected)
    with pytest.raises(CheckpointError, match=r"has no RNG state \(saved with rng=False\); pass rng=False"):
        manager.restore(1, model)


def _tiny_gpt2(seed):
    transformers = pytest.importorskip("transformers", reason="Hugging Face models need the `hf` extra")
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def test_hugging_face_model_round_trip_keeps_tied_weights(tmp_path):
    model = _tiny_gpt2(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 100, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    manager = CheckpointManager(tmp_path / "hf")
    path = manager.save(1, model, optimizer)
    expected = params(model)

    # Tied weights are stored once and recorded as an alias.
    stored = safetensors.torch.load_file(path / "model.safetensors")
    manifest = json.loads((path / "manifest.json").read_text())
    aliases = manifest["contents"]["model"]["aliases"]
    assert aliases == {"lm_head.weight": "transformer.wte.weight"}
    assert set(stored) | set(aliases) == set(expected)
    assert manifest["versions"]["transformers"]

    other = _tiny_gpt2(1)
    other_optimizer = torch.optim.AdamW(other.parameters(), lr=1e-3)
    manager.restore(1, other, other_optimizer)
    assert_same_tensors(params(other), expected)
    assert other.lm_head.weight.data_ptr() == other.transformer.wte.weight.data_ptr()
    assert_same_tensors(optimizer_tensors(other_optimizer), optimizer_tensors(optimizer))
    model.eval(), other.eval()  # no dropout: the same weights give the same logits
    with torch.no_grad():
        assert torch.equal(other(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_peft_model_saves_only_the_adapter(tmp_path):
    peft = pytest.importorskip(
        "peft", reason="PEFT adapters are tested when the optional peft package is installed"
    )
    model = peft.get_peft_model(
        _tiny_gpt2(0), peft.LoraConfig(r=4, target_modules=["c_attn"], lora_dropout=0.0, fan_in_fan_out=True)
    )
    with torch.no_grad():
        for name, value in model.named_parameters():
            if "lora_B" in name:
                value.normal_()  # LoRA B starts at zero; make the adapter non-trivial
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    manager = CheckpointManager(tmp_path / "peft")
    path = manager.save(4, model, optimizer)
    adapter = peft.get_peft_model_state_dict(model)
    stored = safetensors.torch.load_file(path / "model.safetensors")
    assert sorted(stored) == sorted(f"0:{key}" for key in adapter)  # adapter only, no base weights
    assert json.loads((path / "manifest.json").read_text())["contents"]["model"]["kind"] == "peft_adapter"

    base_before = model.base_model.model.transformer.wpe.weight.detach().clone()
    with torch.no_grad():
        for value in model.parameters():
            value.add_(1.0)  # move adapters and base weights
    manager.restore(4, model, optimizer)
    assert_same_tensors(peft.get_peft_model_state_dict(model), {k: v.clone() for k, v in adapter.items()})
    # The base weights were not in the checkpoint, so they keep whatever the live model holds.
    assert torch.equal(model.base_model.model.transformer.wpe.weight, base_before + 1.0)

    plain = _tiny_gpt2(0)
    before = params(plain)
    with pytest.raises(CheckpointError, match=r"holds PEFT adapter weights, but `model` is not a PEFT model"):
        manager.restore(4, plain, rng=False)
    assert_same_tensors(params(plain), before)


def test_reference_model_round_trip(tmp_path, mlp):
    model, optimizer, scheduler = mlp
    ref_model, _, _ = make_mlp(seed=3)
    manager = CheckpointManager(tmp_path)
    manager.save(2, model, optimizer, scheduler, ref_model=ref_model)
    expected_ref = params(ref_model)
    with torch.no_grad():
        for value in ref_model.parameters():
            value.mul_(0.5)  # the EMA / synced reference drifted
    manager.restore(2, model, ref_model=ref_model)
    assert_same_tensors(params(ref_model), expected_ref)
    manager.save(3, model)
    with pytest.raises(CheckpointError, match=r"has no reference model \(saved without `ref_model`\)"):
        manager.restore(3, model, ref_model=ref_model)


@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_rollout_buffer_and_extra_state_round_trip(kind, tmp_path, mlp):
    model, _, _ = mlp
    guard = Guard(mode="kl_control")
    buffer = {
        "input_ids": torch.randint(0, 50, (4, 7)),
        "advantages": torch.randn(4).to(torch.bfloat16),
        "mask": torch.rand(4, 7) > 0.5,
        "transposed": torch.arange(6, dtype=torch.float64).reshape(2, 3).t(),  # non-contiguous
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "prompts": ["a", "b"],
        "generation_step": 12,
        "sampling": {"temperature": 0.7, "top_p": None, "nested": [1, [2, {"x": True}]]},
    }
    manager = _manager(kind, tmp_path)
    manager.save(9, model, rollout_buffer=buffer, extra_state=guard.state_dict())
    restored = manager.restore(9, model)
    assert list(restored.rollout_buffer) == list(buffer)  # same keys, same order
    for key, value in buffer.items():
        got = restored.rollout_buffer[key]
        if isinstance(value, torch.Tensor):
            assert got.dtype == value.dtype, key
            assert torch.equal(got, value), key
        else:
            assert got == value, key
    assert restored.extra_state == guard.state_dict()
    Guard(mode="kl_control").load_state_dict(restored.extra_state)
    # Restored values are copies: mutating them does not change the stored checkpoint.
    restored.rollout_buffer["input_ids"].zero_()
    restored.extra_state["seen"] = -1
    again = manager.restore(9, model)
    assert torch.equal(again.rollout_buffer["input_ids"], buffer["input_ids"])
    assert again.extra_state == guard.state_dict()


def test_in_memory_extra_state_shares_no_container_with_the_caller(mlp):
    model, _, _ = mlp
    state = {"guard": {"history": [[[0.5, 1.5], [2.0, -1.0]]], "notes": ["a"], "seen": 3}, "flag": None}
    expected = json.loads(json.dumps(state))
    manager = CheckpointManager(in_memory=True)
    manager.save(1, model, extra_state=state)
    state["guard"]["history"][0][1][0] = 99.0  # the caller changes its own state after the save
    state["guard"]["notes"].append("b")
    restored = manager.restore(1, model)
    assert restored.extra_state == expected
    restored.extra_state["guard"]["history"][0][0].clear()  # and then the restored copy
    assert manager.restore(1, model).extra_state == expected


def test_in_memory_snapshot_is_not_aliased_by_later_training(mlp):
    model, optimizer, scheduler = mlp
    train_step(model, optimizer, scheduler)
    manager = CheckpointManager(in_memory=True)
    manager.save(1, model, optimizer, scheduler)
    saved_params, saved_moments = params(model), optimizer_tensors(optimizer)
    for _ in range(2):  # train, restore, train again: the snapshot must survive both
        manager.restore(1, model, optimizer, scheduler)
        assert_same_tensors(params(model), saved_params)
        assert_same_tensors(optimizer_tensors(optimizer), saved_moments)
        train_step(model, optimizer, scheduler)


def test_optimizer_state_goes_through_weights_only_load(tmp_path, mlp):
    model, optimizer, scheduler = mlp
    train_step(model, optimizer, scheduler)
    path = CheckpointManager(tmp_path).save(1, model, optimizer, scheduler)
    state = torch.load(path / "optimizer.pt", weights_only=True)
    assert state["param_groups"][0]["betas"] == (0.9, 0.95)
    assert set(state["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    assert torch.load(path / "scheduler.pt", weights_only=True)["last_epoch"] == 1


def test_discard_newer_rolls_the_store_back(tmp_path, mlp):
    model, optimizer, scheduler = mlp
    manager = CheckpointManager(tmp_path, keep_last=None)
    for step in (10, 20, 30, 40):
        train_step(model, optimizer, scheduler)
        manager.save(step, model, optimizer, scheduler)
        manager.mark_good(step)
    # A hack began at step 35 but 30 was marked good before it was detected: roll back to before 30.
    restored = manager.restore("last_good", model, optimizer, scheduler, before_step=30, discard_newer=True)
    assert restored.step == 20
    assert restored.good
    assert manager.steps() == (10, 20)
    assert manager.good_steps() == (10, 20)
    assert not [name for name in (tmp_path).iterdir() if name.name.startswith((".del-", ".tmp-"))]
    manager.save(21, model, optimizer, scheduler)  # steps may be counted again from the restored one
    assert manager.steps() == (10, 20, 21)

    memory = CheckpointManager(in_memory=True, keep_last=None)
    for step in (1, 2, 3):
        memory.save(step, model)
        memory.mark_good(step)
    memory.restore(1, model, discard_newer=True)
    assert memory.steps() == (1,)
    assert memory.good_steps() == (1,)
