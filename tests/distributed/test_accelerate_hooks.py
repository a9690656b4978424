"""register_state / read_state with a stand-in accelerator (the real one is exercised on 2 processes)."""

from __future__ import annotations

import json
import os
import re

import pytest

from loopguard import Guard
from loopguard.adapters.accelerate_hooks import STATE_FILE, rank_sync, read_state, register_state
from loopguard.adapters.loop import LoopGuard
from loopguard.exceptions import LoopguardTypeError, StateError


class Handle:
    def __init__(self, hooks, hook):
        self.hooks, self.hook = hooks, hook

    def remove(self):
        self.hooks.remove(self.hook)


class FakeAccelerator:
    """The two hook registries of accelerate.Accelerator, called the way save_state / load_state call them."""

    def __init__(self, main=True):
        self.is_main_process = main
        self.save_hooks, self.load_hooks = [], []

    def register_save_state_pre_hook(self, hook):
        self.save_hooks.append(hook)
        return Handle(self.save_hooks, hook)

    def register_load_state_pre_hook(self, hook):
        self.load_hooks.append(hook)
        return Handle(self.load_hooks, hook)

    def save_state(self, folder):
        for hook in self.save_hooks:
            hook([], [], str(folder))

    def load_state(self, folder):
        for hook in self.load_hooks:
            hook([], str(folder))


def test_state_is_saved_as_json_by_the_main_process_and_loaded_everywhere(tmp_path):
    betas = []
    loop = LoopGuard(Guard(warmup_steps=3, beta=0.3), set_beta=betas.append)
    loop.rollbacks = [{"step": 9, "restored_step": 4}]
    main, other = FakeAccelerator(), FakeAccelerator(main=False)
    register_state(main, loop)
    register_state(other, loop)
    other.save_state(tmp_path / "b")
    assert not (tmp_path / "b").exists()  # only the main process writes
    main.save_state(tmp_path / "a")
    assert json.loads((tmp_path / "a" / STATE_FILE).read_text())["rollbacks"] == loop.rollbacks
    assert read_state(tmp_path / "a") == loop.state_dict()
    restored = []
    twin = LoopGuard(Guard(warmup_steps=3, beta=0.3), set_beta=restored.append)
    loader = FakeAccelerator(main=False)  # another rank
    handles = register_state(loader, twin)
    loader.load_state(tmp_path / "a")
    assert twin.state_dict() == loop.state_dict()
    assert restored == [0.3]
    assert betas == []
    for handle in handles:
        handle.remove()
    assert loader.save_hooks == loader.load_hooks == []
    with pytest.warns(RuntimeWarning, match="starts fresh"):
        main.load_state(tmp_path / "missing")


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(LoopguardTypeError, match="state_dict"):
        register_state(FakeAccelerator(), object())
    with pytest.raises(LoopguardTypeError, match="file name"):
        register_state(FakeAccelerator(), LoopGuard(Guard(warmup_steps=3)), filename="../x.json")
    (tmp_path / STATE_FILE).write_text("[1]")
    with pytest.raises(ValueError, match="JSON object"):
        read_state(tmp_path)
    assert not rank_sync(FakeAccelerator()).active


def test_a_bad_state_file_is_refused_at_load_never_half_applied_or_skipped(tmp_path):
    loop = LoopGuard(Guard(warmup_steps=3, beta=0.3))
    accelerator = FakeAccelerator()
    register_state(accelerator, loop)
    accelerator.save_state(tmp_path / "good")
    text = (tmp_path / "good" / STATE_FILE).read_text()
    before = loop.state_dict()
    bad = tmp_path / "nan"
    bad.mkdir()
    (bad / STATE_FILE).write_text(text.replace('"vote": 0.0', '"vote": NaN', 1))
    with pytest.raises(StateError, match=re.escape("NaN is not JSON")):
        accelerator.load_state(bad)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / STATE_FILE)
    with pytest.raises(StateError, match="is not a regular file"):  # refused at once, never blocks
        accelerator.load_state(fifo)
    assert loop.state_dict() == before
