"""What the reference sample and the new signals cost per step: Guard.step time with each switched on or off.

Usage::

    python benchmarks/reference_cost.py               # batches of 16 x 12, 256 x 256 and 1024 x 512 tokens
    python benchmarks/reference_cost.py --out DIR     # where reference_cost.json and reference_cost.md go

A healthy synthetic GRPO stream (token ids from a Zipf(1.1) vocabulary of 2,000 words, groups of 4, Gaussian
rewards, as in ``false_alarms.py``) runs through four Guards with the default signals and ``kl_control``:

* ``reference off`` -- ``Guard(reference_steps=0)``: the warm-up baseline alone (loopguard before the
  reference sample);
* ``reference on`` -- the default ``Guard()``: the first 3 steps are the reference sample, every relative
  statistic is scored against it during the warm-up, and warm-up trends are tested;
* ``+ add_reference`` -- the default Guard given 3 extra reference batches before training
  (:meth:`Guard.add_reference <loopguard.Guard.add_reference>`); what they cost to *generate* is the
  trainer's (one generation and scoring pass each, once), not measured here;
* ``+ takeover`` -- the default Guard with the ``takeover`` signal added.

Each configuration is timed over the 20 warm-up steps (where the reference and the trend tests work) and the
40 steps after, as the median of 5 repeats; ``add_reference`` is timed per batch. One thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from loopguard import Guard, Observation

WARMUP = 20
AFTER = 40
GROUP = 4
VOCAB = 2_000
SHAPES = ((16, 12), (256, 256), (1024, 512))
CONFIGS = ("reference off", "reference on", "+ add_reference", "+ takeover")
REPEATS = 5


def _probabilities() -> np.ndarray:
    weights = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    return weights / weights.sum()


Batch = tuple[int, np.ndarray, np.ndarray]  # step, rewards, completion ids


def _batches(batch: int, tokens: int, count: int, seed: int) -> list[Batch]:
    rng = np.random.default_rng(seed)
    probabilities = _probabilities()
    out = []
    for step in range(count):
        ids = rng.choice(VOCAB, size=(batch, tokens), p=probabilities)
        out.append((step, rng.normal(size=batch), ids))
    return out


def _observation(batch: Batch) -> Observation:
    """A fresh Observation: a token batch kept from an earlier run would hold its n-gram counts."""
    step, rewards, ids = batch
    return Observation(step, rewards, completion_ids=ids, group_size=GROUP)


def _guard(config: str) -> Guard:
    signals = ["repetition", "diversity", "length", "collapse", "drift"]
    if config == "+ takeover":
        signals.append("takeover")
    reference = 0 if config == "reference off" else 3
    return Guard(signals, mode="kl_control", beta=0.01, reference_steps=reference)


def _time(config: str, stream: list[Batch], extra: list[Batch]) -> dict[str, float]:
    guard = _guard(config)
    added = []
    if config == "+ add_reference":
        for batch in extra:
            observation = _observation(batch)
            started = time.perf_counter()
            guard.add_reference(observation)
            added.append(time.perf_counter() - started)
    seconds = []
    for batch in stream:
        observation = _observation(batch)
        started = time.perf_counter()
        guard.step(observation)
        seconds.append(time.perf_counter() - started)
    return {
        "warmup_ms": 1000 * statistics.fmean(seconds[:WARMUP]),
        "after_ms": 1000 * statistics.fmean(seconds[WARMUP:]),
        "add_reference_ms": 1000 * statistics.fmean(added) if added else float("nan"),
    }


def measure() -> list[dict[str, Any]]:
    rows = []
    for batch, tokens in SHAPES:
        stream = _batches(batch, tokens, WARMUP + AFTER, seed=batch)
        extra = _batches(batch, tokens, 3, seed=batch + 1)
        for config in CONFIGS:
            repeats = [_time(config, stream, extra) for _ in range(REPEATS)]
            row = {key: statistics.median(r[key] for r in repeats) for key in repeats[0]}
            rows.append({"batch": batch, "tokens": tokens, "config": config, **row})
            print(f"  {batch} x {tokens} {config}: {row}", flush=True)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| batch x tokens | configuration | ms/step, warm-up | ms/step, after | add_reference ms/batch |",
        "|---|---|---:|---:|---:|",
    ]
    for row in rows:
        added = "--" if np.isnan(row["add_reference_ms"]) else f"{row['add_reference_ms']:.2f}"
        lines.append(
            f"| {row['batch']} x {row['tokens']} | {row['config']} | {row['warmup_ms']:.2f} | "
            f"{row['after_ms']:.2f} | {added} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"), help="output folder")
    options = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits

    started = time.perf_counter()
    with threadpool_limits(limits=1):
        rows = measure()
    table = markdown(rows)
    os.makedirs(options.out, exist_ok=True)
    with open(os.path.join(options.out, "reference_cost.json"), "w", encoding="utf-8") as handle:
        json.dump({"rows": rows, "seconds": time.perf_counter() - started}, handle, indent=1)
    with open(os.path.join(options.out, "reference_cost.md"), "w", encoding="utf-8") as handle:
        handle.write(table)
    print(table)
    elapsed = time.perf_counter() - started
    print(f"wrote {options.out}/reference_cost.json and reference_cost.md ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
