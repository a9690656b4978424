"""SIGKILL during save (and the pruning, marking and clean-up around it): the store is never corrupted.

Each trial forks a child from this process (torch already imported, so a trial costs milliseconds, not an
interpreter start-up), and the child saves the next step with a full state (model, AdamW, scheduler, RNGs,
rollout buffer, extra state), lets pruning run (``keep_last=2``) and marks the step good. The child is
SIGKILLed either at the k-th file-system call it makes (``os.write``, ``fsync``, ``rename``, ``unlink``,
``rmdir``, ``mkdir``, ``open``; a write first writes a random prefix of its bytes, so files end at random
byte offsets), with k swept over every call of a whole save-prune-mark cycle, or after a random delay.
After every trial the parent checks: every ``step-N`` directory holds a manifest, no temporary directory is
listed, every listed checkpoint verifies, the previous rollback target is still there (or a newer good one
replaced it), and ``restore("last_good")`` returns a complete, earlier checkpoint with the right contents.
"""

import os
import random
import signal
import time
import traceback
from collections import Counter

import pytest
import torch
from checkpoint_helpers import make_mlp

from loopguard.checkpoint import CheckpointManager

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fault injection forks children (POSIX only)")

SWEEP_TRIALS = 55  # killed at the k-th file-system call: always a kill
TIMED_TRIALS = 15  # killed after a random delay: a kill or a completed save
HOOKED = ("write", "fsync", "rename", "unlink", "rmdir", "mkdir", "open")


def _fill(model, value):
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)


def _save_and_mark(directory, step, model, optimizer, scheduler):
    manager = CheckpointManager(directory, keep_last=2)
    _fill(model, float(step))
    buffer = {"ids": torch.full((4, 3), step), "step": step}
    manager.save(step, model, optimizer, scheduler, rollout_buffer=buffer, extra_state={"step": step})
    manager.mark_good(step)


def _hook(setattr_, on_call):
    """Route every HOOKED os function through ``on_call(name, original, args, kwargs)``."""
    for name in HOOKED:
        original = getattr(os, name)

        def hooked(*args, _name=name, _original=original, **kwargs):
            return on_call(_name, _original, args, kwargs)

        setattr_(os, name, hooked)


def _arm_kill(kill_at, rng):
    calls = 0

    def on_call(name, original, args, kwargs):
        nonlocal calls
        calls += 1
        if calls == kill_at:
            if name == "write":
                fd, data = args
                original(fd, memoryview(data)[: rng.randrange(len(memoryview(data)) + 1)])
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    _hook(setattr, on_call)


def _wait(pid, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.002)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"child {pid} hung")


def _check_store(directory, step, previous_good):
    raw = os.listdir(directory)
    for name in raw:  # before any clean-up: every step-N is a complete checkpoint
        if name.startswith("step-"):
            assert os.path.isfile(os.path.join(directory, name, "manifest.json")), name
    manager = CheckpointManager(directory, keep_last=2)  # clears what the killed save left behind
    assert not [name for name in os.listdir(directory) if name.startswith((".tmp-", ".del-"))]
    steps = manager.steps()
    assert all(saved <= step for saved in steps)
    for saved in steps:
        manager.verify(saved)  # complete and intact, hash by hash
    good = manager.last_good()
    assert good is not None
    assert good >= previous_good
    fresh, fresh_optimizer, fresh_scheduler = make_mlp(seed=1)
    restored = manager.restore("last_good", fresh, fresh_optimizer, fresh_scheduler)
    assert restored.step == good
    assert all(torch.all(parameter == float(good)) for parameter in fresh.parameters())
    assert restored.extra_state == {"step": good}
    assert torch.equal(restored.rollout_buffer["ids"], torch.full((4, 3), good))
    assert fresh_optimizer.state_dict()["param_groups"][0]["betas"] == (0.9, 0.95)
    return any(name.startswith((".tmp-", ".del-")) for name in raw)


def test_sigkill_during_save_never_corrupts_the_store(tmp_path, monkeypatch):
    directory = str(tmp_path / "store")
    model, optimizer, scheduler = make_mlp(0)
    for step in range(3):
        _save_and_mark(directory, step, model, optimizer, scheduler)

    # Count the file-system calls of one full cycle (save with pruning, then mark_good) and time it.
    calls = Counter()

    def count(name, original, args, kwargs):
        calls[name] += 1
        return original(*args, **kwargs)

    with monkeypatch.context() as patch:
        _hook(patch.setattr, count)
        start = time.perf_counter()
        _save_and_mark(directory, 3, model, optimizer, scheduler)
        duration = time.perf_counter() - start
    total = sum(calls.values())
    assert calls["write"] >= 10
    assert calls["fsync"] >= 10
    assert calls["rename"] >= 3
    assert calls["unlink"] >= 5

    rng = random.Random(20240611)
    outcomes = Counter()
    for trial in range(SWEEP_TRIALS + TIMED_TRIALS):
        step = trial + 4
        previous_good = CheckpointManager(directory, keep_last=2).last_good()
        timed = trial >= SWEEP_TRIALS
        kill_at = None if timed else 1 + (trial * total) // SWEEP_TRIALS + rng.randrange(2)
        kill_at = None if kill_at is None else min(kill_at, total)
        seed = rng.randrange(2**32)
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = 0
            try:
                if kill_at is not None:
                    _arm_kill(kill_at, random.Random(seed))
                _save_and_mark(directory, step, model, optimizer, scheduler)
            except BaseException:
                traceback.print_exc()
                code = 3
            finally:
                os._exit(code)
        if timed:
            time.sleep(rng.uniform(0.0, 1.2 * duration))
            os.kill(pid, signal.SIGKILL)
        status = _wait(pid)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert killed or os.waitstatus_to_exitcode(status) == 0, f"trial {trial}: child exited with {status}"
        outcomes["killed" if killed else "completed"] += 1
        if _check_store(directory, step, previous_good):
            outcomes["left a temporary directory"] += 1

    assert outcomes["killed"] >= 50, outcomes
    assert outcomes["left a temporary directory"] >= 10, (
        outcomes
    )  # kills landed inside saves, not only between
