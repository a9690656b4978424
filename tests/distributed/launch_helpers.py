"""Launch a worker script on 2 CPU processes (gloo) with torch.distributed.run, and read each rank's JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_workers(script, out_dir, *args, timeout=240):
    """Run ``script`` on 2 processes (torch.distributed.run, gloo); returns the finished process, whatever its code."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    root = os.path.dirname(os.path.dirname(HERE))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        os.path.join(HERE, script),
        str(out_dir),
        *args,
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def launch(script, out_dir, *args, timeout=240):
    """Run ``script`` on 2 processes; returns [rank0 result, rank1 result] (fails with the log otherwise)."""
    done = run_workers(script, out_dir, *args, timeout=timeout)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    results = []
    for rank in (0, 1):
        with open(os.path.join(out_dir, f"rank{rank}.json"), encoding="utf-8") as handle:
            results.append(json.load(handle))
    return results


def leave():
    """End a worker rank whose result is written, without Python's and C++'s exit-time teardown.

    torch 2.13's gloo can abort a finished rank while the interpreter shuts down ("terminate called without
    an active exception", SIGABRT with no Python frame left; seen in about 1 run in 10 under CPU load), after
    the rank has written its result. The launcher would report the abort as the rank's failure.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
