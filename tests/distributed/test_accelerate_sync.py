"""examples/accelerate_loop.py on 2 processes (gloo, CPU): the reward bug is in rank 1's data only.

``LOOPGUARD_TEST_NOSYNC=1`` runs the worker without the reduction: rank 1 then stops alone while rank 0
waits in DDP's gradient all-reduce, and the launch times out (how this test was shown to be able to fail).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("accelerate")

from launch_helpers import launch


def test_accelerate_loop_ranks_take_one_decision(tmp_path):
    args = ("nosync",) if os.environ.get("LOOPGUARD_TEST_NOSYNC") == "1" else ()
    zero, one = launch("accelerate_rank_worker.py", tmp_path, *args, timeout=120)
    assert zero["world"] == one["world"] == 2
    assert zero["steps"] == one["steps"], "ranks took different actions or hold different betas"
    actions = [entry["action"] for entry in zero["steps"].values()]
    assert "rollback" in actions
    assert actions[-1] == "stop"
    assert zero["rollbacks"] == one["rollbacks"]
    assert zero["rollbacks"][0]["restored_step"] < zero["rollbacks"][0]["step"]
    # after every restore (the rollback, and the restore at the stop) both ranks hold the same weights: the
    # rollback's are the checkpoint it names, the stop's the newest good one (saved and confirmed after it)
    assert zero["after_rollback"] == one["after_rollback"]
    first = str(zero["rollbacks"][0]["step"])
    assert zero["after_rollback"][first] == zero["checkpoint"]
    last = str(max(int(step) for step in zero["after_rollback"]))
    assert zero["final"] == one["final"] == zero["after_rollback"][last]
    # loopguard's state went through accelerator.save_state / load_state as JSON, on both ranks
    assert zero["state_round_trip"]
    assert one["state_round_trip"]
    assert zero["collectives"] == one["collectives"] > 0


def test_accelerate_example_runs_in_one_process(tmp_path):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, os.path.join(root, "examples", "accelerate_loop.py"), "--folder", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # Accelerate imports DeepSpeed when it is installed, and DeepSpeed prints its accelerator choice to stdout
    assert any(line.startswith("1 process(es), ") for line in done.stdout.splitlines()), done.stdout
    assert "rolled back at step" in done.stdout
    assert (tmp_path / "state" / "loopguard_state.json").is_file()
