"""Tampered, truncated, symlinked and malicious checkpoints are refused by name; nothing live changes."""

import json
import os
import random
import re
import shutil

import numpy as np
import pytest
import torch
from checkpoint_helpers import make_mlp, optimizer_tensors, params, train_step, two_step_store

from loopguard.checkpoint import CheckpointError

FILES = [
    "model.safetensors",
    "optimizer.pt",
    "scheduler.pt",
    "rng.json",
    "rng.safetensors",
    "ref_model.safetensors",
    "rollout_buffer.safetensors",
    "rollout_buffer.json",
    "extra_state.json",
]


@pytest.fixture
def store(tmp_path):
    """A store with good step 5 and step 10 (the one tampered with), and a live run that moved on."""
    manager, objects = two_step_store(tmp_path / "store")
    train_step(*objects[:3])  # the live run moved on
    return manager, tmp_path / "store" / "step-00000010", objects


def _live(objects):
    model, optimizer, scheduler, ref_model = objects
    return (
        params(model),
        optimizer_tensors(optimizer),
        scheduler.state_dict(),
        params(ref_model),
        torch.get_rng_state(),
        random.getstate(),
        np.random.get_state()[1].copy(),  # noqa: NPY002
    )


def _assert_untouched(before, objects):
    after = _live(objects)
    for left, right in zip(before[:2] + before[3:4], after[:2] + after[3:4], strict=True):
        assert left.keys() == right.keys()
        assert all(torch.equal(left[key], right[key]) for key in left)
    assert before[2] == after[2]
    assert torch.equal(before[4], after[4])
    assert before[5] == after[5]
    assert np.array_equal(before[6], after[6])


def _restore_fails(manager, objects, pattern, step=10):
    model, optimizer, scheduler, ref_model = objects
    before = _live(objects)
    with pytest.raises(CheckpointError, match=pattern):
        manager.restore(step, model, optimizer, scheduler, ref_model=ref_model)
    _assert_untouched(before, objects)


def _rewrite_manifest(path, edit):
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


def _rehash(path, name):
    import hashlib

    data = (path / name).read_bytes()

    def edit(manifest):
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}

    _rewrite_manifest(path, edit)


def test_untampered_store_restores(store):
    manager, _, objects = store
    model, optimizer, scheduler, ref_model = objects
    assert manager.restore(10, model, optimizer, scheduler, ref_model=ref_model).extra_state == {"step": 10}


@pytest.mark.parametrize("name", FILES)
def test_flipped_byte_is_refused_naming_the_file(store, name):
    manager, path, objects = store
    data = bytearray((path / name).read_bytes())
    data[len(data) // 2] ^= 0x01
    (path / name).write_bytes(bytes(data))
    _restore_fails(manager, objects, re.escape(f"checkpoint file {path / name} fails its SHA-256 check"))
    with pytest.raises(CheckpointError, match=re.escape(str(path / name))):
        manager.verify(10)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "extra_state.json"])
def test_truncated_or_extended_file_is_refused(store, name):
    manager, path, objects = store
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[: len(data) // 2])
    _restore_fails(
        manager,
        objects,
        re.escape(
            f"checkpoint file {path / name} has {len(data) // 2} bytes, but manifest.json records {len(data)}"
        ),
    )
    (path / name).write_bytes(data + b"\0")
    _restore_fails(manager, objects, re.escape(f"{path / name} has more than {len(data)} bytes"))


def test_deleted_file_is_refused(store):
    manager, path, objects = store
    (path / "optimizer.pt").unlink()
    _restore_fails(manager, objects, re.escape(f"checkpoint file {path / 'optimizer.pt'} is missing"))


def test_symlinked_file_is_refused_even_with_the_right_bytes(store, tmp_path):
    manager, path, objects = store
    outside = tmp_path / "elsewhere.pt"
    shutil.copy(path / "optimizer.pt", outside)
    (path / "optimizer.pt").unlink()
    os.symlink(outside, path / "optimizer.pt")
    _restore_fails(
        manager, objects, re.escape(f"{path / 'optimizer.pt'} is a symlink, refusing the checkpoint")
    )


def test_symlinked_manifest_is_refused(store, tmp_path):
    manager, path, objects = store
    shutil.copy(path / "manifest.json", tmp_path / "manifest.json")
    (path / "manifest.json").unlink()
    os.symlink(tmp_path / "manifest.json", path / "manifest.json")
    _restore_fails(manager, objects, re.escape(f"{path / 'manifest.json'} is a symlink"))


def test_symlinked_checkpoint_directory_is_refused(store, tmp_path):
    manager, path, objects = store
    shutil.move(path, tmp_path / "moved")
    os.symlink(tmp_path / "moved", path)
    assert manager.steps() == (5, 10)  # listed, so that it is refused loudly rather than skipped
    _restore_fails(manager, objects, re.escape(f"checkpoint directory {path} is a symlink, refusing it"))
    model, optimizer, scheduler, ref_model = objects
    assert manager.restore("last_good", model, optimizer, scheduler, ref_model=ref_model).step == 5


@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_unexpected_symlink_or_directory_inside_is_refused(store, kind):
    manager, path, objects = store
    if kind == "symlink":
        os.symlink("/etc/hostname", path / "notes.txt")
        pattern = f"{path / 'notes.txt'} is a symlink, refusing the checkpoint"
    else:
        os.mkdir(path / "extra")
        pattern = f"{path / 'extra'} is a directory or special file, refusing the checkpoint"
    _restore_fails(manager, objects, re.escape(pattern))


def test_unlisted_regular_file_is_ignored(store):
    manager, path, objects = store
    (path / "README.txt").write_text("never opened")
    model, optimizer, scheduler, ref_model = objects
    assert manager.restore(10, model, optimizer, scheduler, ref_model=ref_model).step == 10


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "sub/model.safetensors", "notes.txt"])
def test_manifest_paths_outside_the_checkpoint_are_refused(store, name):
    manager, path, objects = store

    def edit(manifest):
        manifest["files"][name] = {"sha256": "0" * 64, "bytes": 1}

    _rewrite_manifest(path, edit)
    _restore_fails(
        manager,
        objects,
        re.escape(f"{path / 'manifest.json'} lists {name!r}, which is not a checkpoint file name"),
    )


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda m: m.update(step=11), "records step 11, but its directory is step 10"),
        (lambda m: m.update(format_version=2), "has format_version 2; this loopguard reads 1"),
        (lambda m: m.update(format="other"), "is not a loopguard checkpoint manifest"),
        (lambda m: m["files"].pop("optimizer.pt"), "lists files inconsistent with its contents"),
        (
            lambda m: m["files"]["model.safetensors"].update(sha256="xyz"),
            "has a malformed entry for 'model.safetensors'",
        ),
        (lambda m: m["contents"].update(model=None), "has a malformed contents['model'] entry"),
    ],
)
def test_malformed_manifest_is_refused(store, edit, problem):
    manager, path, objects = store
    _rewrite_manifest(path, edit)
    _restore_fails(manager, objects, re.escape(f"{path / 'manifest.json'} {problem}"))


def test_manifest_that_is_not_json_is_refused(store):
    manager, path, objects = store
    (path / "manifest.json").write_text('{"format": NaN')
    _restore_fails(manager, objects, re.escape(f"{path / 'manifest.json'} is not valid JSON"))


def test_pickle_payload_never_runs(store, tmp_path):
    manager, path, objects = store
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"state": {}, "param_groups": [Payload()]}, path / "optimizer.pt")
    _rehash(path, "optimizer.pt")  # an attacker who can write the store can also fix the hashes
    _restore_fails(
        manager,
        objects,
        re.escape(f"checkpoint file {path / 'optimizer.pt'} could not be loaded with weights_only=True"),
    )
    assert not marker.exists()


def test_malformed_safetensors_with_a_matching_hash_is_refused(store):
    manager, path, objects = store
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}  ")
    _rehash(path, "model.safetensors")
    _restore_fails(
        manager,
        objects,
        re.escape(f"checkpoint file {path / 'model.safetensors'} is not a valid safetensors file"),
    )


@pytest.mark.parametrize(
    ("build", "pattern"),
    [
        (
            lambda: torch.nn.Sequential(
                torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(8, 3)
            ),
            r"does not match `model` at '0.weight': saved \(16, 6\) torch.float32, live \(8, 6\) torch.float32",
        ),
        (
            lambda: torch.nn.Linear(6, 3),
            r"does not match `model`: `model` has 'bias', 'weight' that the checkpoint lacks",
        ),
        (
            lambda: make_mlp(0)[0].to(torch.float64),
            r"saved \(16, 6\) torch.float32, live \(16, 6\) torch.float64",
        ),
    ],
)
def test_model_that_does_not_fit_is_refused(store, build, pattern):
    manager, _, objects = store
    other = build()
    before = params(other)
    objects_before = _live(objects)
    with pytest.raises(CheckpointError, match=pattern):
        manager.restore(10, other, objects[1], objects[2], ref_model=objects[3])
    assert all(torch.equal(before[key], value) for key, value in params(other).items())
    _assert_untouched(objects_before, objects)


def test_optimizer_and_scheduler_that_do_not_fit_are_refused(store):
    manager, _, objects = store
    model, optimizer, scheduler, _ref_model = objects
    before = _live(objects)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match=r"holds AdamW optimizer state, but `optimizer` is SGD"):
        manager.restore(10, model, sgd)
    groups = torch.optim.AdamW(
        [{"params": [model[0].weight]}, {"params": [model[0].bias, model[3].weight, model[3].bias]}]
    )
    with pytest.raises(CheckpointError, match=r"holds 1 parameter group\(s\), `optimizer` has 2"):
        manager.restore(10, model, groups)
    step_lr = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    with pytest.raises(CheckpointError, match=r"holds LambdaLR scheduler state, but `scheduler` is StepLR"):
        manager.restore(10, model, optimizer, step_lr)
    _assert_untouched(before, objects)
    assert scheduler.state_dict() == before[2]


def test_malformed_or_symlinked_good_index_is_refused(store, tmp_path):
    manager, _, objects = store
    index = tmp_path / "store" / "good.json"
    assert json.loads(index.read_text())["good"] == [5]
    index.write_text('{"format": "loopguard-good-index", "format_version": 1, "good": ["5"]}')
    with pytest.raises(CheckpointError, match=re.escape(f"{index} is malformed; delete it to forget")):
        manager.last_good()
    shutil.copy(index, tmp_path / "good.json")
    index.unlink()
    os.symlink(tmp_path / "good.json", index)
    with pytest.raises(CheckpointError, match=re.escape(f"{index} is a symlink, refusing it.")):
        manager.restore("last_good", *objects[:3])
