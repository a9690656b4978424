"""Sharded checkpoints: CheckpointManager's DCP engine against its own file engine and against plain DCP.

Usage::

    python benchmarks/sharded_checkpoint.py                 # 64M parameters (768 MiB with AdamW), ~3 minutes
    python benchmarks/sharded_checkpoint.py --quick --out /tmp/sharded   # smoke test (0.5M parameters)

The model is a stack of square ``nn.Linear`` layers (fp32) with AdamW state after one step (3x the parameter
bytes in all). Measured, as the median of ``--repeats`` runs (files in the page cache when restored, for
every engine alike; every engine ``fsync``-s what it writes):

* **one process** (a gloo group of 1):
  * *files engine*: ``CheckpointManager.save`` / ``restore`` of the unsharded model (today's format:
    safetensors + ``torch.save``, SHA-256 while writing, verified before loading);
  * *DCP engine*: the same calls on the model after ``fully_shard`` (DTensor parameters): DCP writes, each
    rank hashes its files, rank 0 commits the manifest; a restore verifies, checks keys and shapes, loads;
  * *plain DCP*: ``torch.distributed.checkpoint.save`` / ``load`` of the same state, nothing else.
  The DCP engine's ratio to the file engine decides whether one engine could serve both (the issue's rule:
  within 1.2x).
* **two processes** (gloo, the model sharded over both): the DCP engine and plain DCP, per rank.

From the two-process restore throughput per rank (verification included), the rollback time of a sharded
7B policy is estimated: fp32 parameters and AdamW's two moments (84 GB), split evenly over 8 or 64 ranks,
each reading from storage as fast as this machine's page cache and hashing at this machine's SHA-256 speed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

MIB = 2**20


def build(layers: int, width: int, *, sharded: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
    if sharded:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def timed(repeats: int, run: Callable[[int], None]) -> float:
    times = []
    for index in range(repeats):
        start = time.perf_counter()
        run(index)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(layers: int, width: int, repeats: int, folder: str, *, files_engine: bool) -> dict[str, Any]:
    """Save/restore seconds of each engine on this process group (run on every rank)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load
    from torch.distributed.checkpoint.state_dict_saver import save

    from loopguard.checkpoint import CheckpointManager

    rank = dist.get_rank()
    result: dict[str, Any] = {}
    if files_engine:
        model, optimizer = build(layers, width, sharded=False)
        manager = CheckpointManager(os.path.join(folder, "files"), keep_last=1)
        result["files_save_s"] = timed(repeats, lambda i: manager.save(i + 1, model, optimizer, rng=False))
        result["files_restore_s"] = timed(
            repeats, lambda i: manager.restore("latest", model, optimizer, rng=False)
        )
        del model, optimizer
    model, optimizer = build(layers, width, sharded=True)
    manager = CheckpointManager(os.path.join(folder, "dcp-engine"), keep_last=1)
    dist.barrier()
    result["engine_save_s"] = timed(repeats, lambda i: manager.save(i + 1, model, optimizer, rng=False))
    dist.barrier()
    result["engine_restore_s"] = timed(
        repeats, lambda i: manager.restore("latest", model, optimizer, rng=False)
    )

    def plain_save(index: int) -> None:
        path = os.path.join(folder, "plain-dcp", str(index))
        model_state, optim_state = get_state_dict(model, optimizer)
        save({"model": model_state, "optimizer": optim_state}, storage_writer=FileSystemWriter(path))

    def plain_load(index: int) -> None:
        path = os.path.join(folder, "plain-dcp", str(index))
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        load(state, storage_reader=FileSystemReader(path))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    dist.barrier()
    result["dcp_save_s"] = timed(repeats, plain_save)
    dist.barrier()
    result["dcp_restore_s"] = timed(repeats, plain_load)
    own = [
        name for name in os.listdir(os.path.join(folder, "plain-dcp", "0")) if name.startswith(f"__{rank}_")
    ]
    result["rank_bytes"] = sum(os.path.getsize(os.path.join(folder, "plain-dcp", "0", name)) for name in own)
    dist.barrier()
    return result


def _worker(
    rank: int,
    world: int,
    store: str,
    layers: int,
    width: int,
    repeats: int,
    folder: str,
    out: str,
    files_engine: bool,
) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    result = measure(layers, width, repeats, folder, files_engine=files_engine)
    results: list[Any] = [None] * world
    dist.all_gather_object(results, result)
    if rank == 0:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(results, handle)
    dist.destroy_process_group()
    _leave()


def _leave() -> None:
    """End a spawned rank whose result is written, without the interpreter's exit-time teardown.

    torch 2.13's gloo can abort a finished rank while the interpreter shuts down ("terminate called without
    an active exception", SIGABRT with no Python frame left; about 1 run in 10 under CPU load).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def sha256_gb_per_s() -> float:
    data = os.urandom(256 * MIB)
    start = time.perf_counter()
    hasher = hashlib.sha256()
    view = memoryview(data)
    for offset in range(0, len(data), 8 * MIB):
        hasher.update(view[offset : offset + 8 * MIB])
    return len(data) / (time.perf_counter() - start) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mparams", type=float, default=64.0, help="parameters, in millions")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="0.5M parameters, 1 repeat (a smoke test)")
    parser.add_argument("--dir", default=None, help="where the stores go (default: a temp folder)")
    parser.add_argument("--out", default="benchmarks/results", help="folder for sharded_checkpoint.json")
    args = parser.parse_args(argv)
    mparams, repeats = (0.5, 1) if args.quick else (args.mparams, args.repeats)
    width = 1024 if mparams >= 8 else 256
    layers = max(2, round(mparams * 1e6 / width**2))
    params = layers * width * width
    torch.set_num_threads(1)
    import torch.multiprocessing as mp

    base = tempfile.mkdtemp(prefix="loopguard-sharded-", dir=args.dir)
    # Both runs in spawned processes, so this one never starts gloo: the sharded model keeps its process group
    # alive after the group is destroyed, and gloo threads still running at the interpreter's exit can abort
    # a process after its work is done (pytorch/pytorch#179291). Each worker leaves without that exit.
    try:
        runs = {}
        for name, world, files_engine in (("one", 1, True), ("two", 2, False)):
            out = os.path.join(base, f"{name}.json")
            spawn_args = (
                world,
                os.path.join(base, f"pg-{world}"),
                layers,
                width,
                repeats,
                os.path.join(base, name),
                out,
                files_engine,
            )
            mp.spawn(_worker, args=spawn_args, nprocs=world, join=True)
            with open(out, encoding="utf-8") as handle:
                runs[name] = json.load(handle)
        (one,), two = runs["one"], runs["two"]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    total = params * 4 * 3
    hash_speed = sha256_gb_per_s()
    slowest = max(two, key=lambda entry: entry["engine_restore_s"])
    per_rank_restore = slowest["rank_bytes"] / slowest["engine_restore_s"] / 1e9
    per_rank_save = slowest["rank_bytes"] / max(entry["engine_save_s"] for entry in two) / 1e9
    seven_b = 7.0e9 * (4 + 8)
    estimate = {
        str(ranks): {
            "bytes_per_rank": seven_b / ranks,
            "restore_s": seven_b / ranks / 1e9 / per_rank_restore,
            "save_s": seven_b / ranks / 1e9 / per_rank_save,
        }
        for ranks in (8, 64)
    }
    report = {
        "parameters": params,
        "checkpoint_bytes": total,
        "repeats": repeats,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__},
        "sha256_gb_per_s": hash_speed,
        "one_process": one,
        "two_processes": two,
        "ratios": {
            "engine_over_files_save": one["engine_save_s"] / one["files_save_s"],
            "engine_over_files_restore": one["engine_restore_s"] / one["files_restore_s"],
            "engine_over_dcp_save_1": one["engine_save_s"] / one["dcp_save_s"],
            "engine_over_dcp_restore_1": one["engine_restore_s"] / one["dcp_restore_s"],
            "engine_over_dcp_save_2": max(e["engine_save_s"] for e in two)
            / max(e["dcp_save_s"] for e in two),
            "engine_over_dcp_restore_2": max(e["engine_restore_s"] for e in two)
            / max(e["dcp_restore_s"] for e in two),
        },
        "per_rank_gb_per_s": {"save": per_rank_save, "restore": per_rank_restore},
        "estimate_7b": estimate,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "sharded_checkpoint.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
    mib = total / MIB
    print(
        f"{params / 1e6:.1f}M parameters, {mib:.0f} MiB per checkpoint (weights + AdamW), median of {repeats}"
    )
    print("| engine | processes | save | restore |")
    print("|---|---:|---:|---:|")
    print(
        f"| files (today's, unsharded) | 1 | {one['files_save_s']:.2f} s | {one['files_restore_s']:.2f} s |"
    )
    print(f"| DCP engine (sharded) | 1 | {one['engine_save_s']:.2f} s | {one['engine_restore_s']:.2f} s |")
    print(f"| plain DCP | 1 | {one['dcp_save_s']:.2f} s | {one['dcp_restore_s']:.2f} s |")
    engine2 = (max(e["engine_save_s"] for e in two), max(e["engine_restore_s"] for e in two))
    dcp2 = (max(e["dcp_save_s"] for e in two), max(e["dcp_restore_s"] for e in two))
    print(f"| DCP engine (sharded) | 2 | {engine2[0]:.2f} s | {engine2[1]:.2f} s |")
    print(f"| plain DCP | 2 | {dcp2[0]:.2f} s | {dcp2[1]:.2f} s |")
    ratios = report["ratios"]
    print(
        f"DCP engine / files engine: save {ratios['engine_over_files_save']:.2f}x, "
        f"restore {ratios['engine_over_files_restore']:.2f}x; integrity overhead over plain DCP: "
        f"save {ratios['engine_over_dcp_save_2']:.2f}x, "
        f"restore {ratios['engine_over_dcp_restore_2']:.2f}x (2 ranks)"
    )
    print(
        f"SHA-256 here: {hash_speed:.2f} GB/s; per rank: save {per_rank_save:.2f} GB/s, "
        f"restore {per_rank_restore:.2f} GB/s"
    )
    for ranks, row in estimate.items():
        print(
            f"7B policy + AdamW (84 GB) on {ranks} ranks: {row['bytes_per_rank'] / 1e9:.1f} GB per rank, "
            f"save ~{row['save_s']:.0f} s, rollback ~{row['restore_s']:.0f} s"
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
