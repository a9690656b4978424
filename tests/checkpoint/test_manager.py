"""CheckpointManager's contract: arguments, layout, listing, good marks, last_good, pruning, clean-up."""

import json
import os
import re

import numpy as np
import pytest
import torch
from checkpoint_helpers import make_mlp
from hypothesis import given, settings
from hypothesis import strategies as st

import loopguard.checkpoint as checkpoint
from loopguard import ConfigError, LoopguardTypeError
from loopguard.checkpoint import CheckpointError, CheckpointManager, steps_to_keep


def _model():
    return torch.nn.Linear(3, 2)


@pytest.fixture(params=["disk", "memory"])
def manager_factory(request, tmp_path):
    def build(**kwargs):
        if request.param == "disk":
            return CheckpointManager(tmp_path / "store", **kwargs)
        return CheckpointManager(in_memory=True, **kwargs)

    return build


def test_public_names():
    assert checkpoint.__all__ == [
        "FORMAT_VERSION",
        "CheckpointError",
        "CheckpointManager",
        "CheckpointWriteError",
        "RestoredCheckpoint",
        "steps_to_keep",
    ]
    assert issubclass(CheckpointError, ValueError)
    assert issubclass(checkpoint.CheckpointWriteError, OSError)


# ------------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"keep_last": True}, LoopguardTypeError, "`keep_last` must be an integer (not bool), got True."),
        ({"keep_last": 0}, ConfigError, "`keep_last` must be >= 1, got 0."),
        ({"keep_last": 2.0}, LoopguardTypeError, "`keep_last` must be an integer, got 2.0 of type float."),
        ({"in_memory": 1}, LoopguardTypeError, "`in_memory` must be a bool, got 1 of type int."),
    ],
)
def test_bad_settings(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        CheckpointManager(in_memory=kwargs.pop("in_memory", True), **kwargs)


def test_directory_rules(tmp_path):
    with pytest.raises(
        ConfigError, match=re.escape("`directory` must be a path when in_memory=False, got None.")
    ):
        CheckpointManager()
    with pytest.raises(ConfigError, match=re.escape("`directory` must be None when in_memory=True")):
        CheckpointManager(tmp_path, in_memory=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(
        ConfigError, match=r"`directory` must be a directory that can be created, got '.*file/sub'"
    ):
        CheckpointManager(tmp_path / "file" / "sub")
    with pytest.raises(
        ConfigError, match=r"`directory` must be a directory, got '.*file' \(not a directory\)\."
    ):
        CheckpointManager(tmp_path / "file")
    with pytest.raises(ConfigError, match=re.escape("`directory` must not contain null bytes")):
        CheckpointManager("a\x00b")
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`directory` must be a path string, got 3 of type int.")
    ):
        CheckpointManager(3)


def test_bad_save_arguments(manager_factory):
    manager = manager_factory()
    model = _model()
    cases = [
        (lambda: manager.save(-1, model), ConfigError, "`step` must be >= 0, got -1."),
        (
            lambda: manager.save(True, model),
            LoopguardTypeError,
            "`step` must be an integer (not bool), got True.",
        ),
        (
            lambda: manager.save(1.0, model),
            LoopguardTypeError,
            "`step` must be an integer, got 1.0 of type float.",
        ),
        (lambda: manager.save(1, "model"), LoopguardTypeError, "`model` must be a torch.nn.Module, got str."),
        (
            lambda: manager.save(1, model, rng=1),
            LoopguardTypeError,
            "`rng` must be a bool, got 1 of type int.",
        ),
        (
            lambda: manager.save(1, model, ref_model=model),
            ConfigError,
            "`ref_model` must be a separate module from `model`, got the same object.",
        ),
        (
            lambda: manager.save(1, model, object()),
            LoopguardTypeError,
            "`optimizer` must have state_dict() and load_state_dict() methods, got object.",
        ),
        (
            lambda: manager.save(1, model, extra_state=[1]),
            LoopguardTypeError,
            "`extra_state` must be a dict (a JSON object), got list.",
        ),
        (
            lambda: manager.save(1, model, extra_state={"x": float("nan")}),
            ConfigError,
            "`extra_state['x']` must be finite (JSON has no NaN or Infinity), got nan.",
        ),
        (
            lambda: manager.save(1, model, extra_state={"x": (1, 2)}),
            LoopguardTypeError,
            "`extra_state['x']` must be a JSON value (dict with str keys, list, str, int, finite float, bool or "
            "None), got tuple (1, 2) (use a list: JSON has no tuples).",
        ),
        (
            lambda: manager.save(1, model, extra_state={1: 2}),
            LoopguardTypeError,
            "`extra_state` must have str keys (JSON objects), got key 1.",
        ),
        (
            lambda: manager.save(1, model, rollout_buffer=[torch.zeros(2)]),
            LoopguardTypeError,
            "`rollout_buffer` must be a mapping of names to tensors or JSON values, got list.",
        ),
        (
            lambda: manager.save(1, model, rollout_buffer={"__metadata__": 1}),
            ConfigError,
            "`rollout_buffer` keys must be non-empty names of at most 256 characters, without null bytes, other "
            "than '__metadata__', got '__metadata__'.",
        ),
        (
            lambda: manager.save(1, model, rollout_buffer={"x": torch.zeros(2).to_sparse()}),
            LoopguardTypeError,
            "`rollout_buffer['x']` is a torch.sparse_coo tensor (only dense tensors are saved); it cannot be saved.",
        ),
        (
            lambda: manager.save(1, model, rollout_buffer={"x": torch.zeros(2, dtype=torch.complex64)}),
            LoopguardTypeError,
            "`rollout_buffer['x']` is a tensor of dtype torch.complex64 (safetensors dtypes only); it cannot be saved.",
        ),
        (
            lambda: manager.save(1, model, rollout_buffer={"x": {"y": float("inf")}}),
            ConfigError,
            "`rollout_buffer['x']['y']` must be finite (JSON has no NaN or Infinity), got inf.",
        ),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            call()
    assert manager.steps() == ()  # nothing was written by any failed save


def test_optimizer_state_that_needs_unpickling_is_refused_at_save(tmp_path):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.param_groups[0]["schedule"] = lambda step: step  # not restorable with weights_only=True
    manager = CheckpointManager(tmp_path)
    with pytest.raises(
        LoopguardTypeError,
        match=re.escape(
            "`optimizer.state_dict()['param_groups'][0]['schedule']` holds a function (<function "
        ),
    ) as info:
        manager.save(1, model, optimizer)
    assert (
        "torch.load(weights_only=True) cannot restore: checkpoints never unpickle arbitrary objects"
        in str(info.value)
    )
    assert manager.steps() == ()


def test_the_torch_state_check_accepts_restorable_trees_and_names_the_first_entry_it_refuses():
    import collections

    from loopguard.checkpoint._state import MAX_DEPTH, check_torch_state

    Pair = collections.namedtuple("Pair", "a b")
    good = collections.OrderedDict(
        w=torch.zeros(2), meta=[1, 2.5, "x", None, True, b"b", 1j, torch.Size([2]), torch.float32],
        groups=({"lr": 0.1, 3: {torch.device("cpu")}},), half=torch.zeros(2, dtype=torch.complex64),
    )  # fmt: skip
    check_torch_state("state", good)  # a dtype safetensors cannot hold is left to the checkpoint's own rule
    deep: object = 1.0
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    cases = [
        ({"a": [1, {"b": Pair(1, 2)}]}, LoopguardTypeError, "`state['a'][1]['b']` holds a Pair"),
        ({"a": [1, {(1, 2): 3}]}, LoopguardTypeError, "`state['a'][1]` has a key of type tuple"),
        (
            {"a": ({"x": torch.zeros(2).to_sparse()},)},
            LoopguardTypeError,
            "`state['a'][0]['x']` is a torch.sparse",
        ),
        ({"a": deep}, ConfigError, "levels deep"),
    ]
    for state, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            check_torch_state("state", state)


def test_steps_must_increase(manager_factory):
    manager = manager_factory()
    manager.save(10, _model())
    for step in (10, 5):
        with pytest.raises(
            ConfigError,
            match=re.escape(f"`step` must be greater than the newest saved step 10, got {step} (steps"),
        ):
            manager.save(step, _model())


def test_bad_restore_and_mark_arguments(manager_factory):
    manager = manager_factory()
    model = _model()
    manager.save(5, model)
    manager.save(10, model)
    with pytest.raises(
        ConfigError, match=re.escape("`step` must be a saved checkpoint step (5, 10), got 7.")
    ):
        manager.restore(7, model)
    with pytest.raises(
        ConfigError, match=re.escape("`step` must be one of 'last_good', 'latest', got 'best'.")
    ):
        manager.restore("best", model)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`step` must be an int, 'last_good' or 'latest', got 5.0")
    ):
        manager.restore(5.0, model)
    with pytest.raises(
        ConfigError, match=re.escape("`before_step` applies only to step='last_good', got step=5.")
    ):
        manager.restore(5, model, before_step=3)
    with pytest.raises(
        ConfigError, match=re.escape("`before_step` applies only to step='last_good', got step='latest'.")
    ):
        manager.restore("latest", model, before_step=3)
    with pytest.raises(
        CheckpointError, match=r"no checkpoint is marked good in .* \(saved: 5, 10; good: none\)"
    ):
        manager.restore("last_good", model)
    with pytest.raises(
        ConfigError, match=re.escape("`step` must be a saved checkpoint step (5, 10), got 7.")
    ):
        manager.mark_good(7)
    with pytest.raises(ConfigError, match=re.escape("`before_step` must be >= 0, got -1.")):
        manager.last_good(before_step=-1)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`discard_newer` must be a bool, got 'yes' of type str.")
    ):
        manager.restore(5, model, discard_newer="yes")
    with pytest.raises(
        CheckpointError, match=r"has no optimizer state \(saved without `optimizer`\); pass optimizer=None"
    ):
        manager.restore(5, model, torch.optim.SGD(model.parameters(), lr=0.1))
    manager.mark_good(5)
    with pytest.raises(CheckpointError, match=r"no checkpoint before step 5 is marked good"):
        manager.restore("last_good", model, before_step=5)
    assert manager.restore("latest", model).step == 10


def test_empty_store(manager_factory):
    manager = manager_factory()
    assert manager.steps() == ()
    assert manager.good_steps() == ()
    assert manager.last_good() is None
    with pytest.raises(CheckpointError, match=r"no checkpoint is saved in .*; nothing to restore\."):
        manager.restore("latest", _model())


# ------------------------------------------------------------------------------------------- semantics


def test_last_good_is_the_newest_good_strictly_before_the_onset(manager_factory):
    manager = manager_factory(keep_last=None)
    for step in (10, 20, 30, 40):
        manager.save(step, _model())
    for step in (10, 30):
        manager.mark_good(step)
    manager.mark_good(30)  # twice is harmless
    assert manager.good_steps() == (10, 30)
    assert manager.last_good() == 30
    assert manager.last_good(before_step=40) == 30
    assert manager.last_good(before_step=30) == 10  # a checkpoint at the onset step may already be hacked
    assert manager.last_good(before_step=10) is None
    assert manager.restore("last_good", _model(), before_step=31).step == 30


def test_pruning_keeps_the_newest_and_the_rollback_target(manager_factory):
    manager = manager_factory(keep_last=2)
    for step in (10, 20, 30):
        manager.save(step, _model())
        manager.mark_good(step)
    assert manager.steps() == (10, 20, 30)  # 10 is the newest good older than the 2 newest: kept
    manager.save(40, _model())  # hack began; 40 and 50 are never marked good
    manager.save(50, _model())
    assert manager.steps() == (30, 40, 50)
    assert manager.good_steps() == (30,)
    for step in (60, 70, 80):
        manager.save(step, _model())
    assert manager.steps() == (30, 70, 80)  # the rollback target survives any number of bad saves
    assert manager.last_good(before_step=45) == 30


def test_good_marks_persist_across_processes(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=None)
    for step in (1, 2, 3):
        manager.save(step, _model())
    manager.mark_good(2)
    document = json.loads((tmp_path / "good.json").read_text())
    assert document == {"format": "loopguard-good-index", "format_version": 1, "good": [2]}
    again = CheckpointManager(tmp_path)
    assert again.good_steps() == (2,)
    assert again.last_good() == 2


def test_layout_and_manifest(tmp_path, mlp):
    model, optimizer, scheduler = mlp
    manager = CheckpointManager(tmp_path)
    path = manager.save(
        7, model, optimizer, scheduler, rollout_buffer={"a": torch.ones(2), "b": 1}, extra_state={"k": 1}
    )
    assert path == tmp_path / "step-00000007"
    assert path.is_absolute()
    assert sorted(os.listdir(path)) == [
        "extra_state.json",
        "manifest.json",
        "model.safetensors",
        "optimizer.pt",
        "rng.json",
        "rng.safetensors",
        "rollout_buffer.json",
        "rollout_buffer.safetensors",
        "scheduler.pt",
    ]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["format"] == "loopguard-checkpoint"
    assert manifest["format_version"] == checkpoint.FORMAT_VERSION
    assert manifest["step"] == 7
    assert manifest["created"].endswith("Z")
    assert {"loopguard", "python", "torch", "safetensors", "numpy"} <= set(manifest["versions"])
    assert manifest["contents"]["optimizer"] == {"class": "AdamW"}
    assert manifest["contents"]["scheduler"] == {"class": "LambdaLR"}
    for name, entry in manifest["files"].items():
        assert entry["bytes"] == (path / name).stat().st_size
        assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])
    assert set(manifest["files"]) == set(os.listdir(path)) - {"manifest.json"}


def test_store_may_live_anywhere(tmp_path, monkeypatch):
    real = tmp_path / "scratch" / "real"
    real.mkdir(parents=True)
    os.symlink(real, tmp_path / "linked")  # clusters often link scratch space
    manager = CheckpointManager(tmp_path / "linked")
    manager.save(1, _model())
    assert (real / "step-00000001" / "manifest.json").is_file()
    monkeypatch.chdir(tmp_path / "scratch")
    relative = CheckpointManager("real")
    assert relative.directory == real
    assert relative.steps() == (1,)
    monkeypatch.chdir("/")
    assert CheckpointManager(real).steps() == (1,)  # absolute, outside the working directory


def test_leftovers_are_cleaned_and_never_listed(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, _model())
    stale_save = tmp_path / ".tmp-step-00000002-0123456789abcdef"
    stale_delete = tmp_path / ".del-step-00000000-fedcba9876543210"
    stale_index = tmp_path / ".tmp-good-00112233445566aa"
    for directory in (stale_save, stale_delete):
        directory.mkdir()
        (directory / "model.safetensors").write_bytes(b"partial")
    (stale_save / "manifest.json").write_text("{}")  # even a manifest inside a temporary name does not count
    stale_index.write_text("{")
    unrelated = tmp_path / ".tmp-step-notours"
    unrelated.mkdir()
    incomplete = tmp_path / "step-00000003"  # no manifest: not a checkpoint
    incomplete.mkdir()
    assert manager.steps() == (1,)
    CheckpointManager(tmp_path)  # construction clears our own leftovers, and only those
    assert not stale_save.exists()
    assert not stale_delete.exists()
    assert not stale_index.exists()
    assert unrelated.exists()
    assert incomplete.exists()
    with pytest.raises(
        ConfigError, match=r"`step` 3 cannot be saved: .*step-00000003 exists but is not a complete"
    ):
        manager.save(3, _model())
    assert manager.save(4, _model()).name == "step-00000004"


def test_repr_and_properties(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=None)
    assert repr(manager) == f"CheckpointManager({str(tmp_path)!r}, keep_last=None, in_memory=False)"
    assert manager.directory == tmp_path
    assert manager.keep_last is None
    assert not manager.in_memory
    memory = CheckpointManager(in_memory=True)
    assert repr(memory) == "CheckpointManager(None, keep_last=3, in_memory=True)"
    assert memory.directory is None
    assert memory.save(1, _model()) is None


def test_restore_result_carries_step_and_mark(manager_factory):
    manager = manager_factory()
    model, optimizer, scheduler = make_mlp(0)
    manager.save(3, model, optimizer, scheduler)
    manager.mark_good(3)
    restored = manager.restore("last_good", model, optimizer, scheduler)
    assert (restored.step, restored.good, restored.extra_state, restored.rollout_buffer) == (
        3,
        True,
        None,
        None,
    )
    assert restored.created.endswith("Z")
    assert (restored.path is None) == manager.in_memory


# ------------------------------------------------------------------------------------------- properties


def _last_good(good, before):
    candidates = [step for step in good if step < before]
    return max(candidates) if candidates else None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 200), min_size=1, max_size=30, unique=True),
    st.data(),
    st.integers(1, 6),
)
def test_steps_to_keep_preserves_every_reachable_rollback_target(steps, data, keep_last):
    good = data.draw(st.sets(st.sampled_from(steps)))
    keep = steps_to_keep(steps, good, keep_last)
    ordered = sorted(steps)
    assert set(ordered[-keep_last:]) <= keep <= set(steps)
    assert len(keep) <= keep_last + 1
    if good:
        assert max(good) in keep  # the newest good checkpoint is never deleted
    oldest_kept = ordered[-keep_last:][0]
    kept_good = [step for step in good if step in keep]
    for onset in range(oldest_kept + 1, max(steps) + 2):
        assert _last_good(kept_good, onset) == _last_good(good, onset)
    assert steps_to_keep(steps, good, None) == set(steps)


def test_numpy_integer_steps_and_verify(manager_factory):
    manager = manager_factory()
    manager.save(np.int64(5), _model())
    manager.mark_good(np.int32(5))
    assert manager.steps() == (5,)
    assert manager.restore(np.int64(5), _model()).step == 5
    manager.verify(5)
    manager.verify("latest")
    manager.verify("last_good")
    with pytest.raises(ConfigError, match=re.escape("`step` must be a saved checkpoint step (5), got 6.")):
        manager.verify(6)


def test_a_save_reads_the_engine_and_the_refusal_from_one_walk_with_the_same_answers(manager_factory):
    from loopguard.checkpoint import _sharded

    model, optimizer, _ = make_mlp()
    for value in (model, "not a module", torch.nn.Module()):
        assert _sharded.route(value) == (_sharded.engine_of(value), _sharded.unsaveable(value))
    # DeepSpeed ZeRO-3 marks each partitioned parameter with a ds_id: no process holds the weights
    partitioned, _, _ = make_mlp()
    next(partitioned.parameters()).ds_id = 0
    assert _sharded.route(partitioned) == (None, "zero3") == (None, _sharded.unsaveable(partitioned))
    manager = manager_factory()
    with pytest.raises(ConfigError, match="partitioned by DeepSpeed ZeRO-3"):
        manager.save(1, partitioned)
    assert manager.steps() == ()  # refused before anything was written
    manager.save(1, model, optimizer)
    assert manager.steps() == (1,)
