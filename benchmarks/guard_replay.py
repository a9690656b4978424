"""The one-liner's ``Guard.step`` inside a training loop and replayed warm, on one Goodhart run's own batches.

Usage::

    python benchmarks/guard_replay.py                              # scenario token, seed 0, 200 steps
    python benchmarks/guard_replay.py --scenario sentinel --seed 1 --out DIR

One run of the Goodhart benchmark (``benchmarks.goodhart.runner.run_one``, arm ``lg_default``: the bare
``RewardHackMitigator()``) trains with its Guard's ``step`` timed where it runs, between TRL's steps; every
observation the Guard is given is kept, with a copy of the Guard as it was before its first step. The same
observations then go through fresh copies of that Guard ``--repeats`` times in a tight loop, where nothing but
the Guard touches the caches. Printed, and written to ``guard_replay.json``:

* ``in_loop_ms``: ``Guard.step`` per step inside training;
* ``warm_ms``: per step in the best replay;
* ``identical``: whether every replay decided exactly as the run did (verdict, action, beta, every raw
  statistic and score, the explanation), which any change meant to leave the decisions alone must keep.

The gap between the two times is what a step's first touches of loopguard's code and data cost after TRL's
step has filled the caches with its own; it grows with the amount of code a step runs, not its arithmetic.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.goodhart.runner import ONE_LINER, run_one
from loopguard import Guard


def _outcome(decision: Any) -> tuple[Any, ...]:
    return (
        decision.verdict,
        decision.action,
        decision.beta_after,
        dict(decision.raw),
        dict(decision.scores),
        decision.explanation,
    )


Calls = list[tuple[Any, dict[str, Any]]]  # each step's observation and keyword arguments


def record(scenario: str, seed: int, steps: int) -> tuple[Guard, Calls, list[Any], float]:
    """Train one run; its Guard before the first step, the steps' inputs and outcomes, seconds in ``step``."""
    original = Guard.step
    calls: Calls = []
    outcomes: list[Any] = []
    start: list[Guard] = []
    seconds = [0.0]

    def step(self: Guard, observation: Any, **kwargs: Any) -> Any:
        if not start:
            start.append(copy.deepcopy(self))
        began = time.perf_counter()
        decision = original(self, observation, **kwargs)
        seconds[0] += time.perf_counter() - began
        calls.append((observation, kwargs))
        outcomes.append(_outcome(decision))
        return decision

    Guard.step = step  # type: ignore[method-assign]
    try:
        run_one(scenario, ONE_LINER, seed, steps)
    finally:
        Guard.step = original  # type: ignore[method-assign]
    if not start:
        msg = "the run never stepped its Guard"
        raise RuntimeError(msg)
    return start[0], calls, outcomes, seconds[0]


def replay(guard: Guard, calls: Calls, repeats: int) -> tuple[float, list[list[Any]]]:
    """Best seconds over ``repeats`` replays of ``calls`` through copies of ``guard``; each replay's outcomes.

    Each replay starts from batches as the run's Guard first saw them: what the kernels kept on a token
    batch (its n-gram counts) is dropped first.
    """
    best, results = float("inf"), []
    for _ in range(repeats):
        for observation, _kwargs in calls:
            if observation.completion_ids is not None:
                observation.completion_ids._cache.clear()
        twin = copy.deepcopy(guard)
        began = time.perf_counter()
        decisions = [twin.step(observation, **kwargs) for observation, kwargs in calls]
        best = min(best, time.perf_counter() - began)
        results.append([_outcome(decision) for decision in decisions])
    return best, results


def main(argv: list[str] | None = None) -> int:
    """Run, replay, print and write the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="token", help="a Goodhart scenario (default token)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "guard_replay"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    guard, calls, outcomes, in_loop = record(args.scenario, args.seed, args.steps)
    warm, results = replay(guard, calls, args.repeats)
    summary = {
        "scenario": args.scenario,
        "seed": args.seed,
        "steps": len(calls),
        "in_loop_ms": 1000 * in_loop / len(calls),
        "warm_ms": 1000 * warm / len(calls),
        "identical": all(result == outcomes for result in results),
    }
    print(
        f"{args.scenario} seed {args.seed}, {len(calls)} steps: Guard.step {summary['in_loop_ms']:.3f} ms a "
        f"step in the training loop, {summary['warm_ms']:.3f} ms replayed warm (best of {args.repeats}); "
        f"replays decide as the run did: {summary['identical']}"
    )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "guard_replay.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2)
    return 0 if summary["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
