"""Time every signal kernel at three batch sizes on one core; write JSON and a markdown table.

Usage::

    python benchmarks/signal_kernels.py            # full run (about a minute on one core)
    python benchmarks/signal_kernels.py --quick    # fewer repeats and sizes: a smoke test
    python benchmarks/signal_kernels.py --out DIR  # where kernels.json and kernels.md go

Inputs are synthetic but shaped like a GRPO step: B completions of 256 token ids each (a list of lists, as TRL
hands them out), groups of 8 generations per prompt, float rewards, a 4-member reward-model ensemble, and
768-d embeddings for the latent signals. Two targets from the foundation issue are checked and reported:

* the default signal set (what every trainer already provides: rewards, completions, lengths, group size)
  for 1,024 completions x 256 tokens costs under 50 ms on one core;
* ``ngram_repetition_rate`` handles 100,000 trajectories x 128 tokens in under 5 s.

And one from the sharded-scale issue: ``Guard.step`` with the default signals on a realistic GRPO step,
1,024 completions of up to 2,048 tokens (lengths uniform in [1,024, 2,048], about 1.6 M token ids) read
from the trainer's padded id tensor and mask (``TokenBatch.from_padded``), costs at most 30 ms per million
tokens on one core. It is reported against a memory-bandwidth bound: the time to read the padded ids once at
the copy bandwidth measured here. The same step from Python lists (what a reward function receives) is
reported beside it.
"""

from __future__ import annotations

import os

# One core: set before numpy is imported so BLAS/OpenMP pools start with a single thread.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_variable] = "1"

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import loopguard
from loopguard import signals

TOKENS = 256
GROUP = 8
MEMBERS = 4
SIZES = (64, 1_024, 16_384)
EMBED_SIZES = (64, 512, 2_048)
EMBED_DIM = 768
DEFAULT_SET_TARGET_MS = 50.0
SCALE_TARGET_S = 5.0
STEP_ROWS, STEP_WIDTH = 1_024, 2_048
STEP_TARGET_MS_PER_M = 30.0


def _time(function: Callable[[], Any], repeats: int) -> dict[str, float]:
    function()  # warm-up: imports, caches, first-touch allocations
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "repeats": repeats}


def _batch(size: int, rng: np.random.Generator) -> dict[str, Any]:
    ids = rng.integers(0, 32_000, size=(size, TOKENS))
    completion_ids = [row.tolist() for row in ids]  # what TRL hands out: python lists
    rewards = rng.normal(size=size)
    return {
        "completion_ids": completion_ids,
        "rewards": rewards,
        "lengths": [len(row) for row in completion_ids],
        "reference_rewards": rng.normal(size=size),
        "scores": rewards + rng.normal(scale=0.1, size=(MEMBERS, size)),
        "reference_lengths": rng.integers(16, TOKENS, size=size),
        "policy_lengths": rng.integers(16, TOKENS, size=size),
        "history": rng.normal(size=200),
    }


def _default_set(data: dict[str, Any]) -> None:
    """The signals computable from what every trainer already has (rewards, completions, lengths, groups)."""
    batch = signals.as_token_batch("completion_ids", data["completion_ids"])  # convert once, share
    signals.ngram_repetition_rate(batch, n=2, reduce="none")
    signals.distinct_n(batch, n=2)
    signals.reward_length_correlation(data["rewards"], data["lengths"], method="spearman")
    signals.reward_length_slope(data["rewards"], data["lengths"])
    signals.group_reward_std(data["rewards"], GROUP)
    signals.zero_std_group_fraction(data["rewards"], GROUP)
    signals.reward_drift(data["rewards"], data["reference_rewards"], method="wasserstein")
    baseline = signals.robust_baseline(data["history"])
    signals.classify_drop(signals.relative_drop(float(np.mean(data["rewards"])), baseline.median))


def _kernels(data: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    ids, rewards, lengths = data["completion_ids"], data["rewards"], data["lengths"]
    return {
        "ngram_repetition_rate": lambda: signals.ngram_repetition_rate(ids, n=2, reduce="none"),
        "distinct_n": lambda: signals.distinct_n(ids, n=2),
        "reward_length_correlation": lambda: signals.reward_length_correlation(
            rewards, lengths, method="spearman"
        ),
        "reward_length_slope": lambda: signals.reward_length_slope(rewards, lengths),
        "length_stratified_gain": lambda: signals.length_stratified_gain(
            rewards, data["policy_lengths"], data["reference_rewards"], data["reference_lengths"]
        ),
        "group_reward_std": lambda: signals.group_reward_std(rewards, GROUP),
        "zero_std_group_fraction": lambda: signals.zero_std_group_fraction(rewards, GROUP),
        "reward_drift[wasserstein]": lambda: signals.reward_drift(rewards, data["reference_rewards"]),
        "reward_drift[ks]": lambda: signals.reward_drift(rewards, data["reference_rewards"], method="ks"),
        "ensemble_disagreement": lambda: signals.ensemble_disagreement(data["scores"]),
        "ensemble_reward[uwo]": lambda: signals.ensemble_reward(data["scores"], method="uwo"),
        "robust_baseline": lambda: signals.robust_baseline(rewards),
        "default signal set": lambda: _default_set(data),
    }


def _series_kernels(length: int, rng: np.random.Generator) -> dict[str, Callable[[], Any]]:
    series = rng.normal(size=length)
    positive = 100.0 + series  # mean lengths and entropies are non-negative
    return {
        "ema": lambda: signals.ema(series, alpha=0.1),
        "rolling_median": lambda: signals.rolling_median(series, window=20),
        "cusum": lambda: signals.cusum(series, target=0.0, scale=1.0),
        "length_trend": lambda: signals.length_trend(positive),
        "entropy_trend": lambda: signals.entropy_trend(positive),
    }


def _latent_kernels(size: int, rng: np.random.Generator) -> dict[str, Callable[[], Any]]:
    reference = rng.normal(size=(size, EMBED_DIM))
    policy = rng.normal(size=(size, EMBED_DIM))
    policy[: size // 8] += 6.0  # an outlying cluster, so DBSCAN has something to find
    eps = float(np.sqrt(2 * EMBED_DIM))  # about the distance between two standard-normal points
    return {
        "cluster_separation_index": lambda: signals.cluster_separation_index(
            policy, reference, eps=eps, min_samples=5
        ),
        "mahalanobis_outlier_fraction": lambda: signals.mahalanobis_outlier_fraction(
            policy, reference, n_components=min(64, size - 1)
        ),
    }


def _copy_bandwidth() -> float:
    """Bytes per second of one core copying a 256 MiB array (the best of 5): a memory-bandwidth yardstick."""
    source = np.ones(32 * 1024 * 1024, dtype=np.int64)
    target = np.empty_like(source)
    best = min(_time(lambda: np.copyto(target, source), 5)["min_ms"], float("inf"))
    return 2 * source.nbytes / (best / 1e3)  # a copy reads and writes every byte


def guard_step_at_scale(repeats: int, rng: np.random.Generator) -> dict[str, Any]:
    """``Guard.step`` (default signals, after its warm-up) on one padded GRPO step; from lists too."""
    from loopguard import Guard, Observation
    from loopguard.signals import TokenBatch

    lengths = rng.integers(STEP_WIDTH // 2, STEP_WIDTH + 1, size=STEP_ROWS)
    mask = np.arange(STEP_WIDTH)[np.newaxis, :] < lengths[:, np.newaxis]
    ids = np.where(mask, rng.integers(0, 32_000, size=(STEP_ROWS, STEP_WIDTH)), 0)
    rewards = rng.normal(size=STEP_ROWS)
    guard = Guard(mode="log_only", warmup_steps=3, reference_steps=3)
    step = iter(range(1_000_000))

    def padded() -> None:
        batch = TokenBatch.from_padded(ids, mask)
        guard.step(Observation(next(step), rewards, completion_ids=batch, group_size=GROUP))

    rows = [row[:length].tolist() for row, length in zip(ids, lengths, strict=True)]

    def listed() -> None:
        guard.step(Observation(next(step), rewards, completion_ids=rows, group_size=GROUP))

    for _ in range(6):  # the reference sample and the warm-up
        padded()
    tokens = int(lengths.sum())
    padded_ms = _time(padded, repeats)["median_ms"]
    listed_ms = _time(listed, max(1, repeats // 3))["median_ms"]
    bandwidth = _copy_bandwidth()
    bound_ms = ids.nbytes / bandwidth * 1e3
    return {
        "rows": STEP_ROWS,
        "width": STEP_WIDTH,
        "tokens": tokens,
        "padded_ms": padded_ms,
        "padded_ms_per_million_tokens": padded_ms / (tokens / 1e6),
        "lists_ms": listed_ms,
        "lists_ms_per_million_tokens": listed_ms / (tokens / 1e6),
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "read_once_bound_ms": bound_ms,
        "padded_over_bound": padded_ms / bound_ms,
        "target_ms_per_million_tokens": STEP_TARGET_MS_PER_M,
        "within_target": padded_ms / (tokens / 1e6) <= STEP_TARGET_MS_PER_M,
    }


def _markdown(rows: list[dict[str, Any]], sizes_label: str) -> str:
    sizes = sorted({row["size"] for row in rows})
    names = list(dict.fromkeys(row["kernel"] for row in rows))
    lookup = {(row["kernel"], row["size"]): row["median_ms"] for row in rows}
    header = f"| kernel | {' | '.join(f'{sizes_label}={size:,}' for size in sizes)} |"
    lines = [header, "|---|" + "---:|" * len(sizes)]
    for name in names:
        cells = [f"{lookup[(name, size)]:.2f} ms" if (name, size) in lookup else "" for size in sizes]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repeats and sizes, no 100k-trajectory run (smoke test)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    repeats = 3 if args.quick else 15
    rng = np.random.default_rng(0)

    batch_rows: list[dict[str, Any]] = []
    for size in SIZES[:2] if args.quick else SIZES:
        data = _batch(size, rng)
        for name, function in _kernels(data).items():
            reps = max(1, repeats // 5) if size >= 16_384 else repeats
            batch_rows.append({"kernel": name, "size": size, "tokens": TOKENS, **_time(function, reps)})
            print(f"{name:32s} B={size:>6,}  {batch_rows[-1]['median_ms']:9.2f} ms", flush=True)

    series_rows: list[dict[str, Any]] = []
    for length in (100, 1_000, 10_000):
        for name, function in _series_kernels(length, rng).items():
            series_rows.append({"kernel": name, "size": length, **_time(function, repeats)})
            print(f"{name:32s} T={length:>6,}  {series_rows[-1]['median_ms']:9.2f} ms", flush=True)

    latent_rows: list[dict[str, Any]] = []
    for size in EMBED_SIZES[:2] if args.quick else EMBED_SIZES:
        for name, function in _latent_kernels(size, rng).items():
            reps = max(1, repeats // 5) if size >= 2_048 else repeats
            latent_rows.append({"kernel": name, "size": size, "dim": EMBED_DIM, **_time(function, reps)})
            print(f"{name:32s} N={size:>6,}  {latent_rows[-1]['median_ms']:9.2f} ms", flush=True)

    default_ms = next(
        r["median_ms"] for r in batch_rows if r["kernel"] == "default signal set" and r["size"] == 1_024
    )
    targets: dict[str, Any] = {
        "default_set_1024x256_ms": default_ms,
        "default_set_target_ms": DEFAULT_SET_TARGET_MS,
        "default_set_within_target": default_ms < DEFAULT_SET_TARGET_MS,
    }
    if not args.quick:
        scale_ids = [row for row in rng.integers(0, 32_000, size=(100_000, 128))]  # list of numpy rows
        start = time.perf_counter()
        signals.ngram_repetition_rate(scale_ids, n=2, reduce="none")
        seconds = time.perf_counter() - start
        targets.update(
            {
                "repetition_100000x128_s": seconds,
                "repetition_target_s": SCALE_TARGET_S,
                "repetition_within_target": seconds < SCALE_TARGET_S,
            }
        )
        print(f"ngram_repetition_rate 100,000 x 128: {seconds:.2f} s", flush=True)

    step = guard_step_at_scale(3 if args.quick else 9, rng)
    targets.update(
        {
            "guard_step_1024x2048_ms_per_million_tokens": step["padded_ms_per_million_tokens"],
            "guard_step_target_ms_per_million_tokens": STEP_TARGET_MS_PER_M,
            "guard_step_within_target": step["within_target"],
        }
    )
    print(
        f"Guard.step {STEP_ROWS:,} x <= {STEP_WIDTH:,} ({step['tokens']:,} tokens): padded "
        f"{step['padded_ms']:.1f} ms ({step['padded_ms_per_million_tokens']:.1f} ms per M tokens), lists "
        f"{step['lists_ms']:.1f} ms; reading the ids once at {step['copy_bandwidth_gb_s']:.1f} GB/s: "
        f"{step['read_once_bound_ms']:.2f} ms",
        flush=True,
    )

    report = {
        "loopguard": loopguard.__version__,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
        "threads": 1,
        "quick": args.quick,
        "batch": batch_rows,
        "series": series_rows,
        "latent": latent_rows,
        "guard_step": step,
        "targets": targets,
    }
    markdown = "\n\n".join(
        [
            f"### Batch kernels ({TOKENS} tokens per completion, groups of {GROUP}, median, one core)",
            _markdown(batch_rows, "B"),
            "### Series kernels (per-step series of length T)",
            _markdown(series_rows, "T"),
            f"### Latent kernels ({EMBED_DIM}-d policy and reference embeddings, N rows each)",
            _markdown(latent_rows, "N"),
            f"### Guard.step at scale ({STEP_ROWS:,} completions of up to {STEP_WIDTH:,} tokens, median, "
            "one core)",
            "| input | ms | ms per million tokens |\n|---|---:|---:|\n"
            f"| padded ids and mask (`TokenBatch.from_padded`) | {step['padded_ms']:.1f} | "
            f"{step['padded_ms_per_million_tokens']:.1f} |\n"
            f"| Python lists (what a reward function receives) | {step['lists_ms']:.1f} | "
            f"{step['lists_ms_per_million_tokens']:.1f} |\n"
            f"| bound: reading the padded ids once at {step['copy_bandwidth_gb_s']:.1f} GB/s | "
            f"{step['read_once_bound_ms']:.2f} | {step['read_once_bound_ms'] / (step['tokens'] / 1e6):.2f} |",
            "### Targets",
            "\n".join(
                f"- {key}: {value:.4g}" if isinstance(value, float) else f"- {key}: {value}"
                for key, value in targets.items()
            ),
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "kernels.md").write_text(markdown + "\n")
    print()
    print(markdown)
    print(f"\nwrote {args.out / 'kernels.json'} and {args.out / 'kernels.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
