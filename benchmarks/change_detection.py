"""False-alarm rate and detection delay of the tabular CUSUM (loopguard.signals.Cusum) by Monte Carlo.

For k = 0.5 and h in {3, 4, 5, 6} this measures, on i.i.d. N(0, 1) values standardised with the true
target 0 and scale 1:

* ARL0: the mean number of steps to the first (false) alarm with no shift, for the two-sided chart
  (``direction="both"``) and the one-sided chart (``direction="up"``);
* the mean detection delay of the two-sided chart when the mean is shifted by +1 and +2 standard deviations
  from the first step on (zero-start ARL1, in steps; the first shifted step is step 1).

Runs are simulated in parallel (numpy-vectorised across runs, a Python loop over time steps). Up to the
first alarm the chart never resets, so the first-alarm time of the plain recursion is the quantity measured;
before measuring, the script checks its simulator against ``loopguard.signals.cusum`` on a fixed set of
series and stops if any first-alarm time differs. Siegmund's approximation of the one-sided ARL is printed
alongside for reference.

Usage::

    python benchmarks/change_detection.py                 # 2000 runs per cell, seed 0
    python benchmarks/change_detection.py --runs 4000 --out benchmarks/results/change_detection.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from loopguard.signals import cusum

K = 0.5
H_VALUES = (3.0, 4.0, 5.0, 6.0)
SHIFTS = (1.0, 2.0)
BLOCK = 256
MAX_STEPS = 1_000_000
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "change_detection.json"

# draw(rows, start, width) -> values for the given run indices and steps start .. start + width - 1
Draw = Callable[[NDArray[np.int64], int, int], NDArray[np.float64]]


def first_alarm_times(
    draw: Draw, runs: int, h: float, k: float = K, max_steps: int | None = None
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Return the 1-based first step at which S+ > h and at which S- > h, for each run.

    The simulation of a run stops once S+ has crossed; ``t_down`` is ``inf`` where S- had not crossed by
    then (the two-sided first alarm is ``min(t_up, t_down)`` either way). With ``max_steps`` (finite test
    series), runs still without an upward alarm after that many steps keep ``t_up = inf``; without it, such
    runs are an error after ``MAX_STEPS``.
    """
    limit = MAX_STEPS if max_steps is None else max_steps
    t_up = np.full(runs, np.inf)
    t_down = np.full(runs, np.inf)
    active = np.arange(runs, dtype=np.int64)
    s_up = np.zeros(runs)
    s_down = np.zeros(runs)
    start = 0
    while active.size and start < limit:
        block = draw(active, start, min(BLOCK, limit - start))
        done = np.zeros(active.size, dtype=bool)
        for j in range(block.shape[1]):
            z = block[:, j]
            np.maximum(s_up + z - k, 0.0, out=s_up)
            np.maximum(s_down - z - k, 0.0, out=s_down)
            step = start + j + 1
            crossed_up = (s_up > h) & ~done
            if crossed_up.any():
                t_up[active[crossed_up]] = step
                done |= crossed_up
            crossed_down = s_down > h
            if crossed_down.any():
                rows = active[crossed_down]
                t_down[rows] = np.minimum(t_down[rows], step)
        keep = ~done
        active, s_up, s_down = active[keep], s_up[keep], s_down[keep]
        start += BLOCK
    if active.size and max_steps is None:
        msg = f"{active.size} runs had no alarm within {MAX_STEPS} steps (h={h})"
        raise RuntimeError(msg)
    return t_up, t_down


def gaussian_draw(rng: np.random.Generator, shift: float) -> Draw:
    def draw(rows: NDArray[np.int64], start: int, width: int) -> NDArray[np.float64]:
        return rng.standard_normal((rows.size, width)) + shift

    return draw


def check_against_library(seed: int) -> int:
    """Compare the simulator's first-alarm times with loopguard.signals.cusum on fixed series."""
    rng = np.random.default_rng([seed, 999])
    checked = 0
    for h in H_VALUES:
        for shift in (0.0, 1.0):
            series = rng.standard_normal((40, 3000)) + shift

            def replay(
                rows: NDArray[np.int64], start: int, width: int, s: NDArray[np.float64] = series
            ) -> NDArray[np.float64]:
                return s[rows, start : start + width]

            t_up, t_down = first_alarm_times(replay, len(series), h, max_steps=series.shape[1])
            for i, row in enumerate(series):
                up = cusum(row, target=0.0, scale=1.0, k=K, h=h, direction="up").alarms
                both = cusum(row, target=0.0, scale=1.0, k=K, h=h, direction="both").alarms
                expected_up = float(up[0] + 1) if up.size else math.inf
                expected_both = float(both[0] + 1) if both.size else math.inf
                got_both = min(t_up[i], t_down[i])
                if t_up[i] != expected_up or got_both != expected_both:
                    msg = (
                        f"simulator disagrees with loopguard.signals.cusum (h={h}, shift={shift}, run {i}): "
                        f"up {t_up[i]} vs {expected_up}, both {got_both} vs {expected_both}"
                    )
                    raise SystemExit(msg)
                checked += 1
    return checked


def siegmund_arl(shift: float, h: float, k: float = K) -> float:
    """Siegmund's approximation of the one-sided CUSUM ARL (Siegmund 1985), in steps."""
    delta = shift - k
    b = h + 1.166
    if delta == 0.0:
        return b * b
    return (math.exp(-2.0 * delta * b) + 2.0 * delta * b - 1.0) / (2.0 * delta * delta)


def summary(times: NDArray[np.float64]) -> dict[str, float]:
    return {
        "mean": float(times.mean()),
        "se": float(times.std(ddof=1) / math.sqrt(times.size)),
        "median": float(np.median(times)),
    }


def measure(runs: int, seed: int) -> list[dict[str, object]]:
    children = iter(np.random.SeedSequence(seed).spawn(len(H_VALUES) * (1 + len(SHIFTS))))
    rows: list[dict[str, object]] = []
    for h in H_VALUES:
        row: dict[str, object] = {"h": h, "k": K}
        t_up, t_down = first_alarm_times(gaussian_draw(np.random.default_rng(next(children)), 0.0), runs, h)
        row["arl0_two_sided"] = summary(np.minimum(t_up, t_down))
        row["arl0_one_sided"] = summary(t_up)
        row["siegmund_arl0_one_sided"] = siegmund_arl(0.0, h)
        for shift in SHIFTS:
            draw = gaussian_draw(np.random.default_rng(next(children)), shift)
            t_up, t_down = first_alarm_times(draw, runs, h)
            first = np.minimum(t_up, t_down)
            row[f"delay_{shift:g}sigma_two_sided"] = summary(first)
            row[f"wrong_direction_{shift:g}sigma"] = float(np.mean(t_down < t_up))
            row[f"siegmund_delay_{shift:g}sigma_one_sided"] = siegmund_arl(shift, h)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    def cell(row: dict[str, object], key: str) -> str:
        value: dict[str, float] = row[key]  # type: ignore[assignment]
        digits = 2 if value["mean"] < 100 else 0
        return f"{value['mean']:.{digits}f} ± {value['se']:.{digits}f}"

    lines = [
        "| h | ARL0 two-sided | ARL0 one-sided (Siegmund) | delay +1σ | delay +2σ |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['h']:g} | {cell(row, 'arl0_two_sided')} | {cell(row, 'arl0_one_sided')} "
            f"({row['siegmund_arl0_one_sided']:.0f}) | {cell(row, 'delay_1sigma_two_sided')} | "
            f"{cell(row, 'delay_2sigma_two_sided')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="Monte Carlo runs per cell (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of numpy's SeedSequence (default 0)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs must be >= 2")
    began = time.perf_counter()
    checked = check_against_library(args.seed)
    rows = measure(args.runs, args.seed)
    elapsed = time.perf_counter() - began
    table = markdown(rows)
    print(
        f"Tabular CUSUM, k = {K}, i.i.d. N(0, 1); {args.runs} runs per cell, seed {args.seed}; "
        f"mean ± standard error, in steps. Simulator matched loopguard.signals.cusum on {checked} series."
    )
    print()
    print(table)
    print()
    print(f"elapsed {elapsed:.1f} s")
    result = {
        "benchmark": "change_detection",
        "command": "python benchmarks/change_detection.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "runs": args.runs,
        "seed": args.seed,
        "k": K,
        "distribution": "iid normal(shift, 1), target 0, scale 1",
        "delay_definition": "zero-start ARL1: steps to first alarm of the two-sided chart, shift from step 1",
        "library_check_series": checked,
        "rows": rows,
        "markdown": table,
        "elapsed_s": elapsed,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
