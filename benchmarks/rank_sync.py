"""What keeping every rank's decision the same costs per step: measured on 2 ranks, modelled to 64 and 512.

Usage::

    python benchmarks/rank_sync.py               # 2 CPU processes (gloo), about a minute
    python benchmarks/rank_sync.py --quick       # fewer steps: a smoke test
    python benchmarks/rank_sync.py --out DIR     # where rank_sync.json and rank_sync.md go

Each step of a multi-rank run, ``synced_step`` issues two ``all_reduce(max)`` of one or two float64 values and
two broadcasts from the most alarmed rank: the length of its JSON payload (one int64), then the payload (its
Guard state and decision, UTF-8). This script runs the default Guard, and the Guard with the opt-in
``takeover`` signal (whose reference n-grams travel in the state), on 2 processes with gloo over loopback, and
reports per step: the Guard's own time, the synchronised step's, and the payload's bytes. The difference is
the price of agreeing: the winner writes its state as JSON, the four collectives carry it, and every other
rank validates and loads it.

It also measures gloo's latency ``alpha`` (a one-value ``all_reduce``) and bandwidth ``beta`` (a 4 MiB
broadcast) here and models the step's collectives on ``p`` ranks with the usual alpha-beta model (Hockney
1994; Thakur, Rabenseifner and Gropp 2005): a small all-reduce by recursive doubling costs ``ceil(log2 p) x
alpha``, a broadcast of ``S`` bytes by a binomial tree ``ceil(log2 p) x (alpha + S / beta)``. The model is
printed with this machine's numbers and with a cluster's (NCCL over InfiniBand: alpha about 10 us, beta about
10 GB/s); plug in yours. Loopback gloo on a busy 2-core machine overstates alpha.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BATCH, TOKENS, GROUP = 64, 256, 8
WARM = 25  # steps before timing: the reference sample and the warm-up
CONFIGS = ("default signals", "+ takeover")
CLUSTER_ALPHA_S, CLUSTER_BETA_BPS = 10e-6, 10e9
RANKS = (2, 64, 512)


def _observation(step: int, rank: int) -> Any:
    from loopguard import Observation

    rng = np.random.default_rng(1000 * step + rank)
    ids = rng.integers(0, 32_000, size=(BATCH, TOKENS))
    return Observation(step, rng.normal(size=BATCH), completion_ids=ids, group_size=GROUP, kl=0.05)


def _guard(config: str) -> Any:
    from loopguard import Guard

    signals = ["repetition", "diversity", "length", "collapse", "drift"]
    return Guard(signals + (["takeover"] if config == "+ takeover" else []), beta=0.01)


def _worker(rank: int, port: int, steps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist

    from loopguard.adapters.distributed import RankSync, synced_step

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    sync = RankSync()
    results: dict[str, Any] = {}
    for config in CONFIGS:
        synced, alone = _guard(config), _guard(config)
        local, total, payload = [], [], []
        for step in range(WARM + steps):
            observation = _observation(step, rank)
            started = time.perf_counter()
            alone.step(observation)  # the same work without the collectives
            middle = time.perf_counter()
            dist.barrier()  # both ranks start the synchronised step together
            begun = time.perf_counter()
            synced_step(synced, _observation(step, rank), can_rollback=False, sync=sync)
            ended = time.perf_counter()
            if step >= WARM:
                local.append(middle - started)
                total.append(ended - begun)
                payload.append(len(json.dumps({"guard": synced.state_dict()}, default=float)))
        results[config] = {
            "guard_ms": 1e3 * statistics.median(local),
            "synced_ms": 1e3 * statistics.median(total),
            "payload_bytes": int(statistics.median(payload)),
        }
    tiny = torch.zeros(2, dtype=torch.float64)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(200):
        dist.all_reduce(tiny, op=dist.ReduceOp.MAX)
    alpha = (time.perf_counter() - started) / 200
    big = torch.zeros(4 * 1024 * 1024, dtype=torch.uint8)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(10):
        dist.broadcast(big, src=0)
    seconds = (time.perf_counter() - started) / 10
    results["alpha_s"] = alpha
    results["beta_bytes_per_s"] = big.numel() / max(seconds - alpha, 1e-9)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()
    # the result is written: leave without the exit-time teardown, in which torch 2.13's gloo can abort a
    # finished rank ("terminate called without an active exception", about 1 run in 10 under CPU load)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as handle:
        handle.bind(("127.0.0.1", 0))
        return int(handle.getsockname()[1])


def model_ms(ranks: int, payload: int, alpha: float, beta: float) -> float:
    """The step's four collectives on ``ranks`` ranks (alpha-beta model; module docs), in milliseconds."""
    hops = math.ceil(math.log2(ranks))
    reduces = 2 * hops * alpha
    broadcasts = hops * (alpha + 8 / beta) + hops * (alpha + payload / beta)
    return 1e3 * (reduces + broadcasts)


def measure(steps: int) -> dict[str, Any]:
    """Run the two ranks; returns rank 0's measurements."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rank0.json")
        mp.spawn(_worker, args=(_free_port(), steps, out), nprocs=2, join=True)
        return dict(json.loads(Path(out).read_text()))


def markdown(result: dict[str, Any]) -> str:
    alpha, beta = result["alpha_s"], result["beta_bytes_per_s"]
    lines = [
        f"### Measured on 2 ranks (gloo, loopback; {BATCH} completions x {TOKENS} tokens per rank, median)",
        "| configuration | Guard.step alone | synchronised step | extra: JSON, 4 collectives, state loaded "
        "| JSON payload |",
        "|---|---:|---:|---:|---:|",
    ]
    for config in CONFIGS:
        row = result[config]
        extra = row["synced_ms"] - row["guard_ms"]
        lines.append(
            f"| {config} | {row['guard_ms']:.2f} ms | {row['synced_ms']:.2f} ms | {extra:.2f} ms | "
            f"{row['payload_bytes'] / 1024:.1f} KiB |"
        )
    lines += [
        "",
        f"gloo here: alpha {alpha * 1e6:.0f} us (one-value all-reduce), beta {beta / 1e9:.2f} GB/s (4 MiB "
        "broadcast).",
        "",
        "### Modelled: the step's four collectives on p ranks (alpha-beta model)",
        "| configuration | payload | p | this machine's alpha, beta | a cluster's (10 us, 10 GB/s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for config in CONFIGS:
        payload = result[config]["payload_bytes"]
        for ranks in RANKS:
            here = model_ms(ranks, payload, alpha, beta)
            cluster = model_ms(ranks, payload, CLUSTER_ALPHA_S, CLUSTER_BETA_BPS)
            lines.append(
                f"| {config} | {payload / 1024:.1f} KiB | {ranks} | {here:.2f} ms | {cluster:.3f} ms |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="10 timed steps instead of 60")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    result = measure(10 if args.quick else 60)
    result["model"] = {
        config: {
            str(ranks): {
                "here_ms": model_ms(
                    ranks, result[config]["payload_bytes"], result["alpha_s"], result["beta_bytes_per_s"]
                ),
                "cluster_ms": model_ms(
                    ranks, result[config]["payload_bytes"], CLUSTER_ALPHA_S, CLUSTER_BETA_BPS
                ),
            }
            for ranks in RANKS
        }
        for config in CONFIGS
    }
    text = markdown(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rank_sync.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "rank_sync.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
