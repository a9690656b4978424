"""One rank of the 2-process Accelerate test: examples/accelerate_loop.py's run() with the bug on rank 1 only.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node 2 accelerate_rank_worker.py OUT [nosync]``.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    """Run one rank (imports here: pytest's doctest collection imports this file without running it)."""
    import torch

    torch.set_num_threads(1)
    from loopguard.adapters._distributed import RankSync

    out = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "nosync":
        RankSync.active = property(lambda self: False)  # the reduction removed: ranks decide alone
    example = runpy.run_path(
        os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "accelerate_loop.py")
    )
    record = example["run"](
        out, steps=40, bug_step=6, hack_rank=1, warmup=4, patience=3, bonus=5.0, save_every=2, lr=1.0
    )
    with open(os.path.join(out, f"rank{record['rank']}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)


if __name__ == "__main__":
    from launch_helpers import leave

    main()
    leave()  # the result is written: skip the exit-time teardown that can abort a finished rank
