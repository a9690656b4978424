"""The store's lock across processes: a writer waits while another process holds it; a dead holder holds nothing.

The lock is ``filelock``'s ``flock`` on ``<store>/.lock`` (``loopguard.checkpoint._io.locked``). A child
process takes it, the parent calls ``mark_good`` (which locks the store) from a thread, and the test checks
that the call waits for the child's release -- or, when the child is SIGKILLed while holding the lock, that
it goes on at once (the kernel released the lock with the process) and the store is intact.
"""

import multiprocessing
import os
import signal
import threading
import time

import pytest
from checkpoint_helpers import make_mlp

from loopguard.checkpoint import CheckpointManager
from loopguard.checkpoint._io import locked, open_root

pytestmark = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="the lock holder is a forked child"
)


def _hold(root, ready, release):
    fd = open_root(root)
    try:
        with locked(fd, root):
            ready.set()
            release.wait(60)
    finally:
        os.close(fd)


@pytest.fixture
def saved(tmp_path):
    root = tmp_path / "store"
    manager = CheckpointManager(root)
    model, optimizer, scheduler = make_mlp(0)
    manager.save(5, model, optimizer, scheduler)
    return manager, str(root)


def _mark_in_thread(manager):
    done = threading.Event()
    errors = []

    def mark():
        try:
            manager.mark_good(5)
        except Exception as error:  # reported by the test
            errors.append(error)
        done.set()

    thread = threading.Thread(target=mark, daemon=True)
    thread.start()
    return thread, done, errors


def test_a_writer_waits_while_another_process_holds_the_lock(saved):
    manager, root = saved
    context = multiprocessing.get_context("fork")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(root, ready, release))
    holder.start()
    try:
        assert ready.wait(30), "the child never took the lock"
        thread, done, errors = _mark_in_thread(manager)
        assert not done.wait(0.5), "mark_good went on while another process held the store's lock"
        assert manager.good_steps() == ()  # reading takes no lock
        release.set()
        assert done.wait(30), "mark_good still waits after the lock was released"
        thread.join(30)
    finally:
        release.set()
        holder.join(30)
    assert errors == []
    assert holder.exitcode == 0
    assert manager.good_steps() == (5,)


def test_a_holder_that_died_leaves_no_stale_lock(saved):
    manager, root = saved
    context = multiprocessing.get_context("fork")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(root, ready, release))
    holder.start()
    assert ready.wait(30), "the child never took the lock"
    os.kill(holder.pid, signal.SIGKILL)  # dies holding the lock
    holder.join(30)
    assert holder.exitcode == -signal.SIGKILL
    start = time.monotonic()
    thread, done, errors = _mark_in_thread(manager)
    assert done.wait(30), "a lock held by a dead process was never released"
    thread.join(30)
    assert errors == []
    assert time.monotonic() - start < 10
    assert manager.good_steps() == (5,)
    manager.verify(5)
