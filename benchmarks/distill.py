"""Time and peak memory of ``loopguard.distill.uld_loss`` next to TRL's GOLD ``ULDLoss`` (non-extended), CPU.

Usage::

    python benchmarks/distill.py                    # B=8, T=256, V in {32k, 128k} (a few minutes on 2 cores)
    python benchmarks/distill.py --vocabs 1000 --batch 2 --seq 16 --out /tmp/distill   # smoke test

For every vocabulary size ``V`` (student and teacher both ``V``; every position is an answer position) each
implementation runs forward + backward on the same float32 logits, in its own subprocess so that one run's
allocations cannot hide the other's:

* **time**: median over ``--repeats`` runs of forward + backward (wall clock);
* **peak memory**: the process's peak resident set size (``VmHWM``, reset through ``/proc/self/clear_refs``
  right before the first run) minus the resident size just before it, after the inputs exist. It counts
  torch's CPU buffers, which ``tracemalloc`` cannot see; it includes the gradient of the student logits
  (``B * T * V * 4`` bytes, the same for both). Where ``clear_refs`` cannot be written, it is left out.

Both compute the same number (the JSON records the largest difference of loss values). TRL's ``ULDLoss`` is
configured with ``use_extended_uld=False``, ``uld_skip_teacher_eos=False``, cross-entropy weight 0 and
distillation weight 1, which is what ``uld_loss(..., skip_student_eos=True)`` computes. Writes
``distill.json`` and ``distill.md`` into ``--out`` (default ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def _trl_loss() -> Any:
    from trl.experimental.gold.gold_trainer import ULDLoss

    config = types.SimpleNamespace(
        uld_crossentropy_weight=0.0,
        uld_distillation_weight=1.0,
        uld_student_temperature=1.0,
        uld_teacher_temperature=1.0,
        uld_skip_student_eos=True,
        uld_skip_teacher_eos=False,
        use_extended_uld=False,
        uld_token_merge_strategy="observed",
        uld_use_hybrid_loss=False,
    )
    return ULDLoss(config)


def worker(impl: str, vocab: int, batch: int, seq: int, repeats: int) -> dict[str, Any]:
    """One implementation at one size: forward + backward ``repeats`` times; runs in its own process."""
    import torch

    from loopguard.distill import uld_loss

    generator = torch.Generator().manual_seed(0)
    student = torch.randn(batch, seq, vocab, generator=generator).mul_(3.0).requires_grad_(True)
    teacher = torch.randn(batch, seq, vocab, generator=generator).mul_(3.0)
    mask = torch.ones(batch, seq, dtype=torch.bool)
    if impl == "trl":
        trl_loss = _trl_loss()
        labels = torch.ones(batch, seq, dtype=torch.long)

        def run() -> torch.Tensor:
            return trl_loss(student, teacher, labels, labels, labels, labels)  # type: ignore[no-any-return]

    else:

        def run() -> torch.Tensor:
            return uld_loss(student, teacher, mask, mask)

    before = _rss_kib("VmRSS")
    can_reset = _reset_peak()
    times, values = [], []
    for _ in range(repeats):
        student.grad = None
        start = time.perf_counter()
        value = run()
        value.backward()
        times.append(time.perf_counter() - start)
        values.append(float(value.detach()))
        del value
    peak = _rss_kib("VmHWM") if can_reset else None
    return {
        "impl": impl,
        "vocab": vocab,
        "seconds": statistics.median(times),
        "peak_rss_delta_mib": None if peak is None or before is None else (peak - before) / 1024,
        "loss": values[0],
        "threads": torch.get_num_threads(),
    }


def _measure(impl: str, vocab: int, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--worker",
        impl,
        "--vocabs",
        str(vocab),
        "--batch",
        str(args.batch),
        "--seq",
        str(args.seq),
        "--repeats",
        str(args.repeats),
    ]
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        f"B={report['batch']}, T={report['seq']}, forward + backward, float32 CPU, median of "
        f"{report['repeats']} run(s); peak = VmHWM - VmRSS before (MiB).",
        "",
        "| V | loopguard time (s) | TRL time (s) | time ratio TRL/ours | loopguard peak (MiB) "
        "| TRL peak (MiB) | memory ratio TRL/ours | max loss diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        ours, trl = row["loopguard"], row["trl"]
        memory = (
            f"{trl['peak_rss_delta_mib'] / ours['peak_rss_delta_mib']:.2f}"
            if ours["peak_rss_delta_mib"] and trl["peak_rss_delta_mib"] is not None
            else "n/a"
        )
        peak_ours = "n/a" if ours["peak_rss_delta_mib"] is None else f"{ours['peak_rss_delta_mib']:.0f}"
        peak_trl = "n/a" if trl["peak_rss_delta_mib"] is None else f"{trl['peak_rss_delta_mib']:.0f}"
        lines.append(
            f"| {row['vocab']:,} | {ours['seconds']:.2f} | {trl['seconds']:.2f} | "
            f"{trl['seconds'] / ours['seconds']:.2f} | {peak_ours} | {peak_trl} | {memory} | "
            f"{abs(ours['loss'] - trl['loss']):.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32_000, 128_000])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--worker", choices=["loopguard", "trl"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.vocabs[0], args.batch, args.seq, args.repeats)))
        return 0
    rows = []
    for vocab in args.vocabs:
        row = {
            "vocab": vocab,
            "loopguard": _measure("loopguard", vocab, args),
            "trl": _measure("trl", vocab, args),
        }
        rows.append(row)
        print(json.dumps(row))
    report = {
        "batch": args.batch,
        "seq": args.seq,
        "repeats": args.repeats,
        "machine": {
            "python": platform.python_version(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "memory_method": "VmHWM reset via /proc/self/clear_refs, minus VmRSS before the first run",
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "distill.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = _markdown(report)
    (args.out / "distill.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
