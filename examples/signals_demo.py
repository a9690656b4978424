"""Score a healthy and a hacked synthetic GRPO batch with every loopguard signal kernel.

Run:  python examples/signals_demo.py

The batches are shaped like one GRPO step (16 prompts x 8 generations, completions as lists of token ids, a
4-member reward-model ensemble, 32-d response embeddings). The hacked batch carries the symptoms the kernels
are built for: echo-trap completions, reward that grows with length, collapsed in-group reward variance,
ensemble members that disagree on the new outputs, and a tight cluster of outputs far from the reference
policy's. No torch, no GPU, no downloads.
"""

from __future__ import annotations

import numpy as np

from loopguard import signals

PROMPTS, GENERATIONS, VOCAB, DIM, MEMBERS = 16, 8, 1_000, 32, 4
BATCH = PROMPTS * GENERATIONS


def healthy_batch(rng: np.random.Generator) -> dict[str, object]:
    lengths = rng.integers(20, 64, size=BATCH)
    completion_ids = [rng.integers(0, VOCAB, size=length).tolist() for length in lengths]
    prompt_difficulty = np.repeat(rng.normal(size=PROMPTS), GENERATIONS)
    rewards = prompt_difficulty + rng.normal(scale=0.5, size=BATCH)
    return {
        "completion_ids": completion_ids,
        "lengths": lengths,
        "rewards": rewards,
        "scores": rewards + rng.normal(scale=0.1, size=(MEMBERS, BATCH)),
        "embeddings": rng.normal(size=(BATCH, DIM)),
    }


def hacked_batch(rng: np.random.Generator) -> dict[str, object]:
    batch = healthy_batch(rng)
    lengths = np.asarray(batch["lengths"]) + rng.integers(0, 40, size=BATCH)  # answers grow ...
    completion_ids = []
    for i, length in enumerate(lengths):
        if i % 3 == 0:  # ... a third of them end in an echo loop
            prefix = rng.integers(0, VOCAB, size=12).tolist()
            completion_ids.append(prefix + [17, 42] * ((int(length) - 12) // 2))
        else:
            completion_ids.append(rng.integers(0, VOCAB, size=int(length)).tolist())
    lengths = np.array([len(ids) for ids in completion_ids])
    rewards = 0.04 * lengths + rng.normal(scale=0.2, size=BATCH)  # the proxy pays for length
    half = BATCH // 2  # half the prompt groups collapse: every rollout gets the same reward
    rewards[:half] = np.repeat(rewards[:half:GENERATIONS], GENERATIONS)
    member_bias = rng.normal(scale=1.5, size=(MEMBERS, 1))  # members disagree off-distribution
    embeddings = np.asarray(batch["embeddings"]).copy()
    embeddings[: BATCH // 2] = 8.0 + rng.normal(scale=0.2, size=(BATCH // 2, DIM))  # far, tight cluster
    return {
        "completion_ids": completion_ids,
        "lengths": lengths,
        "rewards": rewards,
        "scores": rewards + member_bias + rng.normal(scale=0.1, size=(MEMBERS, BATCH)),
        "embeddings": embeddings,
    }


def score(batch: dict[str, object], reference: dict[str, object], baseline: float) -> dict[str, str]:
    ids = signals.as_token_batch("completion_ids", batch["completion_ids"])  # convert once, share
    repetition = signals.ngram_repetition_rate(ids, n=2)
    worst = float(np.max(signals.ngram_repetition_rate(ids, n=2, reduce="none")))
    diversity = signals.distinct_n(ids, n=2)
    drop = signals.relative_drop(diversity, baseline)
    csi = signals.cluster_separation_index(
        batch["embeddings"], reference["embeddings"], eps=2.0, min_samples=5, normalize=True
    )
    mop = signals.mahalanobis_outlier_fraction(batch["embeddings"], reference["embeddings"])
    rho = signals.reward_length_correlation(batch["rewards"], batch["lengths"], method="spearman")
    slope = signals.reward_length_slope(batch["rewards"], batch["lengths"])
    zero_std = signals.zero_std_group_fraction(batch["rewards"], GENERATIONS)
    drift = signals.reward_drift(batch["rewards"], reference["rewards"], standardize=True)
    return {
        "mean 2-gram repetition rate": f"{repetition:.3f} ({signals.classify_echo(repetition)})",
        "worst completion's repetition": f"{worst:.3f} ({signals.classify_echo(worst)})",
        "distinct-2, drop vs warm-up": f"{diversity:.3f}, drop {drop:.2f} ({signals.classify_drop(drop)})",
        "reward-length Spearman rho": f"{rho:+.3f}",
        "reward per extra token (OLS)": f"{slope:+.4f}",
        "groups with zero reward std": f"{zero_std:.2f}",
        "ensemble disagreement (var)": f"{signals.ensemble_disagreement(batch['scores']):.3f}",
        "reward drift (W1 / ref scale)": f"{drift:.3f}",
        "InfoRM CSI (per point)": f"{csi:.3f}",
        "Mahalanobis outlier fraction": f"{mop:.3f}",
    }


def main() -> None:
    rng = np.random.default_rng(7)
    warmup = [healthy_batch(rng) for _ in range(8)]
    reference = warmup[0]
    diversity = signals.robust_baseline([signals.distinct_n(b["completion_ids"], n=2) for b in warmup])
    healthy = score(healthy_batch(rng), reference, diversity.median)
    hacked = score(hacked_batch(rng), reference, diversity.median)
    width = max(len(name) for name in healthy)
    print(f"{'signal':{width}s}  {'healthy batch':28s}  hacked batch")
    print(f"{'-' * width}  {'-' * 28}  {'-' * 28}")
    for name in healthy:
        print(f"{name:{width}s}  {healthy[name]:28s}  {hacked[name]}")


if __name__ == "__main__":
    main()
