"""Time and memory of CheckpointManager save/restore next to plain torch.save/torch.load; JSON + markdown.

Usage::

    python benchmarks/checkpoint.py                       # ~1M, ~10M, ~100M parameters (2-3 minutes, 2 cores)
    python benchmarks/checkpoint.py --sizes 0.2M --repeats 1 --out /tmp/checkpoint.json   # smoke test
    python benchmarks/checkpoint.py --dir /scratch/bench  # put the stores on another file system

Each model is a stack of square ``nn.Linear`` layers (fp32) with AdamW state after one step (``exp_avg`` and
``exp_avg_sq``: 3x the parameter bytes in total). For every size the script measures:

* **torch.save / torch.load** (baseline): ``torch.save({"model": ..., "optimizer": ...})`` into one file, no
  fsync; then ``torch.load(weights_only=True)`` and both ``load_state_dict`` calls.
* **CheckpointManager (disk)**: ``save`` (safetensors + torch.save, SHA-256 of every byte, fsync of every
  file and directory, atomic rename, and pruning of the previous checkpoint with ``keep_last=1``) and
  ``restore`` (hash verification, decoding into temporaries, checks, copy into the live objects).
* **CheckpointManager (in_memory)**: CPU clones on ``save``; ``restore`` copies them back.

Times are the median of ``--repeats`` runs (files are in the page cache when restored, for both the
baseline and the manager). Memory is measured in a separate run of each operation: *peak RSS delta* is the
process's peak resident set size (``VmHWM``, reset through ``/proc/self/clear_refs`` before the operation)
minus the resident size before it (taken after ``gc.collect()`` and glibc's ``malloc_trim(0)``, so memory
freed by earlier operations is not silently reused) -- it includes tensor buffers, which ``tracemalloc``
does not see; *python peak* is ``tracemalloc``'s peak of Python-level allocations (bytes objects, JSON,
pickles). Where ``clear_refs`` is unavailable, the RSS peak is sampled by ``psutil`` every 5 ms instead
(the JSON says which).
The in-memory ``save`` RSS delta includes the new snapshot itself (it is kept).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from loopguard.checkpoint import CheckpointManager

DEFAULT_SIZES = ("1M", "10M", "100M")
MIB = 2**20


def _parse_size(text: str) -> int:
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1].upper(), 1)
    number = text[:-1] if text[-1].upper() in "KMG" else text
    return int(float(number) * scale)


def _build(parameters: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    width = 1024 if parameters < 50 * 10**6 else 2048
    layers = max(1, round(parameters / (width * width + width)))
    if parameters < width * width:
        width = max(8, int(parameters**0.5))
        layers = 1
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def _rss() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _hwm() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _sampled_peak() -> Iterator[list[int]]:
    import psutil

    process, peak, stop = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peak
    finally:
        stop.set()
        thread.join()


def _trim() -> None:
    """Hand freed heap memory back to the OS (glibc), so an RSS delta is not hidden by reused free lists."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _memory(operation: Callable[[], Any]) -> dict[str, Any]:
    gc.collect()
    _trim()
    exact = os.path.exists("/proc/self/clear_refs") and _reset_peak()
    base = _rss() if exact else 0
    tracemalloc.start()
    if exact:
        operation()
        peak = _hwm()
        method = "VmHWM after /proc/self/clear_refs"
    else:
        import psutil

        base = psutil.Process().memory_info().rss
        with _sampled_peak() as sampled:
            operation()
        peak = sampled[0]
        method = "psutil RSS sampled every 5 ms"
    _, python_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "peak_rss_delta_mib": max(0, peak - base) / MIB,
        "python_peak_mib": python_peak / MIB,
        "method": method,
    }


def _time(operation: Callable[[], Any], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        operation()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _directory_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


def _bench_size(label: str, parameters: int, repeats: int, root: Path) -> list[dict[str, Any]]:
    model, optimizer = _build(parameters)
    count = sum(p.numel() for p in model.parameters())
    rows: list[dict[str, Any]] = []

    # Baseline: torch.save / torch.load of the same state dicts.
    baseline_path = root / f"baseline-{label}.pt"

    def torch_save() -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, baseline_path)

    def torch_load() -> None:
        state = torch.load(baseline_path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    torch_save()  # warm-up (allocations, page cache)
    baseline = {
        "save_s": _time(torch_save, repeats),
        "restore_s": _time(torch_load, repeats),
        "save_memory": _memory(torch_save),
        "restore_memory": _memory(torch_load),
        "bytes": baseline_path.stat().st_size,
    }
    baseline_path.unlink()
    rows.append({"mode": "torch.save / torch.load", **baseline})

    for mode in ("disk", "in_memory"):
        store = root / f"store-{label}"
        manager = (
            CheckpointManager(store, keep_last=1)
            if mode == "disk"
            else CheckpointManager(in_memory=True, keep_last=1)
        )
        counter = [0]

        def save(manager: CheckpointManager = manager, counter: list[int] = counter) -> None:
            counter[0] += 1
            manager.save(counter[0], model, optimizer, rng=False)

        def restore(manager: CheckpointManager = manager) -> None:
            manager.restore("latest", model, optimizer, rng=False)

        save()  # warm-up
        row = {
            "mode": f"CheckpointManager ({mode})",
            "save_s": _time(save, repeats),
            "restore_s": _time(restore, repeats),
            "save_memory": _memory(save),
            "restore_memory": _memory(restore),
            "bytes": _directory_bytes(store / f"step-{counter[0]:08d}") if mode == "disk" else 0,
        }
        rows.append(row)
        del manager
        shutil.rmtree(store, ignore_errors=True)
        gc.collect()

    for row in rows:
        row["size"] = label
        row["parameters"] = count
        row["save_ratio"] = row["save_s"] / baseline["save_s"]
        row["restore_ratio"] = row["restore_s"] / baseline["restore_s"]
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| size | params | mode | save s | restore s | save / torch.save | restore / torch.load "
        "| peak RSS save MiB | peak RSS restore MiB | python peak save / restore MiB | on disk MiB |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        save_memory, restore_memory = row["save_memory"], row["restore_memory"]
        lines.append(
            f"| {row['size']} | {row['parameters'] / 1e6:.1f}M | {row['mode']} | {row['save_s']:.3f} "
            f"| {row['restore_s']:.3f} | {row['save_ratio']:.2f}x | {row['restore_ratio']:.2f}x "
            f"| {save_memory['peak_rss_delta_mib']:.0f} | {restore_memory['peak_rss_delta_mib']:.0f} "
            f"| {save_memory['python_peak_mib']:.1f} / {restore_memory['python_peak_mib']:.1f} "
            f"| {row['bytes'] / MIB:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES), help="comma-separated, e.g. 1M,10M,100M")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per operation (median); default 3")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "checkpoint.json")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where stores are written (default: a temp dir)"
    )
    args = parser.parse_args(argv)

    sizes = [size.strip() for size in args.sizes.split(",") if size.strip()]
    _build(1000)  # import torch's lazy modules (the optimizer pulls in dynamo) before anything is timed
    gc.freeze()  # module-level objects never need collecting: keeps gc.collect() cheap between runs
    root = Path(tempfile.mkdtemp(prefix="loopguard-ckpt-bench-", dir=args.dir))
    rows: list[dict[str, Any]] = []
    try:
        for size in sizes:
            repeats = args.repeats if _parse_size(size) < 50 * 10**6 else max(1, min(args.repeats, 3))
            rows.extend(_bench_size(size, _parse_size(size), repeats, root))
            print(f"done: {size}", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    table = _table(rows)
    print(table)
    report = {
        "rows": rows,
        "environment": {
            "python": platform.python_version(),
            "torch": str(torch.__version__),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "store_dir": str(args.dir or tempfile.gettempdir()),
        },
        "notes": (
            "Median seconds over repeats (100M-class sizes: at most 3). Baseline torch.save does not "
            "fsync; CheckpointManager(disk) fsyncs every file and directory, hashes every byte and prunes "
            "the previous checkpoint. Peak RSS delta: VmHWM (reset via /proc/self/clear_refs) minus RSS "
            "before the operation, after gc.collect() and malloc_trim(0)."
        ),
        "table": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
