"""Run the Goodhart benchmark: ``python -m benchmarks.goodhart [--quick] [--out DIR] [...]``.

Every (scenario, arm, seed) is one GRPO run (see ``runner.py``), run in a pool of ``--workers`` processes
of one thread each. Writes ``goodhart.json`` (every run's per-step record and metrics), ``goodhart.md`` (the
table and the targets) and ``goodhart_<scenario>.png`` (gold / proxy / beta over steps) to ``--out``
(default ``benchmarks/results/goodhart``).

``--from-json FILE [FILE ...]`` rebuilds them without training: from one ``goodhart.json``, or from several
merged into one table (the fixed-beta sweep run once, the loopguard arms rerun after a change: the targets'
ratios to the best fixed beta need both), each (scenario, arm, seed) in one file and every run of one length.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from benchmarks.goodhart.analysis import fixed_sweep_line, markdown, plot, summarize
from benchmarks.goodhart.runner import ARMS, run_one
from benchmarks.goodhart.scenarios import ONSETS, scenario_names

QUICK_SEEDS = 2
FULL_SEEDS = 5
STEPS = 200


def _arms(names: list[str] | None) -> list[str]:
    if not names:
        return list(ARMS)
    unknown = [name for name in names if name not in ARMS]
    if unknown:
        raise SystemExit(f"--arms must name arms among {', '.join(ARMS)}, got {', '.join(unknown)}.")
    return names


def _job(job: tuple[str, str, int, int]) -> dict[str, Any]:
    return run_one(*job)


def _write(out: str, runs: list[dict[str, Any]], header: str, payload: dict[str, Any], plots: bool) -> str:
    """Write goodhart.md, goodhart.json and the plots to ``out``; returns the markdown."""
    summary = summarize(runs)
    table = markdown(summary, header)
    table += f"\nFixed-beta sweep, final gold: {fixed_sweep_line(summary)}.\n"
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "goodhart.md"), "w", encoding="utf-8") as handle:
        handle.write(table)
    with open(os.path.join(out, "goodhart.json"), "w", encoding="utf-8") as handle:
        json.dump({**payload, "summary": summary, "runs": runs}, handle)
    if plots:
        for scenario in dict.fromkeys(run["scenario"] for run in runs):
            plot(runs, scenario, os.path.join(out, f"goodhart_{scenario}.png"))
    return table


def _load(paths: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The runs of one or several ``goodhart.json`` files, and the payload (with its header) about them.

    Several files are merged into one table (a fixed-beta sweep run once, the loopguard arms rerun after a
    change): each (scenario, arm, seed) must come from one file only, and every run must have the same
    number of steps, or the final-gold means would compare different things.
    """
    runs: list[dict[str, Any]] = []
    payloads: list[dict[str, Any]] = []
    origin: dict[tuple[str, str, int], str] = {}
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            payload = json.load(handle)
        for run in payload.pop("runs"):
            key = (run["scenario"], run["arm"], run["seed"])
            if key in origin:
                raise SystemExit(
                    f"--from-json: the run {key[0]} / {key[1]} / seed {key[2]} is in both {origin[key]} and "
                    f"{path}; give each (scenario, arm, seed) once."
                )
            origin[key] = path
            runs.append(run)
        payload.pop("summary", None)
        payloads.append(payload)
    steps = sorted({run["steps"] for run in runs})
    if len(steps) > 1:
        raise SystemExit(f"--from-json: the files hold runs of different lengths ({steps} steps); merge runs "
                         "of one length.")  # fmt: skip
    if len(payloads) == 1:
        payload = payloads[0]
        payload["header"] = payload.get("header") or (
            f"Goodhart benchmark: `{payload.get('command', '?')}` -- {len(runs)} runs of {steps[0]} GRPO "
            f"steps, {payload.get('seeds')} seeds, {payload.get('seconds', 0) / 60:.1f} min. Values are mean "
            "+- std over seeds."
        )
        return runs, payload
    commands = "; ".join(f"`{payload.get('command', '?')}`" for payload in payloads)
    seeds = len({run["seed"] for run in runs})
    minutes = sum(payload.get("seconds", 0) for payload in payloads) / 60
    header = (
        f"Goodhart benchmark, {len(paths)} files merged ({commands}) -- {len(runs)} runs of {steps[0]} GRPO "
        f"steps, {seeds} seeds, {minutes:.1f} min in all. Values are mean +- std over seeds."
    )
    payload = {"command": commands, "header": header, "seconds": minutes * 60, "seeds": seeds,
               "steps": steps[0], "sources": list(paths)}  # fmt: skip
    return runs, payload


def _rebuild(paths: list[str], out: str, *, plots: bool) -> int:
    runs, payload = _load(paths)
    print(_write(out, runs, payload["header"], payload, plots))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.goodhart", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SEEDS} seeds instead of {FULL_SEEDS}")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5, --quick 2)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"GRPO steps per run (default {STEPS})")
    parser.add_argument("--scenarios", nargs="*", default=None, help="subset of scenarios")
    parser.add_argument("--arms", nargs="*", default=None, help="subset of arms")
    parser.add_argument(
        "--onset",
        choices=ONSETS,
        default="both",
        help="flaws staged mid-run, present from step 0 (the <name>@0 scenarios), or both (default)",
    )
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="parallel runs")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "goodhart"), help="output dir")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--from-json",
        nargs="+",
        default=None,
        metavar="FILE",
        help="rebuild table, plots from one goodhart.json, or merge several (each run in one file); no runs",
    )
    options = parser.parse_args(argv)
    if options.from_json is not None:
        return _rebuild(options.from_json, options.out, plots=not options.no_plots)
    seeds = options.seeds if options.seeds is not None else (QUICK_SEEDS if options.quick else FULL_SEEDS)
    if seeds < 1 or options.steps < 20 or options.workers < 1:
        raise SystemExit("--seeds and --workers must be >= 1 and --steps >= 20.")
    scenarios, arms = scenario_names(options.scenarios, options.onset), _arms(options.arms)
    jobs = [(s, a, seed, options.steps) for s in scenarios for a in arms for seed in range(seeds)]
    os.makedirs(options.out, exist_ok=True)
    print(f"goodhart: {len(jobs)} runs ({len(scenarios)} scenarios x {len(arms)} arms x {seeds} seeds, "
          f"{options.steps} steps) on {options.workers} worker(s)", flush=True)  # fmt: skip
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    if options.workers == 1:
        for index, job in enumerate(jobs, 1):
            runs.append(_job(job))
            print(f"  [{index}/{len(jobs)}] {job[0]} {job[1]} seed {job[2]}", flush=True)
    else:
        with ProcessPoolExecutor(options.workers) as pool:
            futures = {pool.submit(_job, job): job for job in jobs}
            for index, future in enumerate(as_completed(futures), 1):
                job = futures[future]
                runs.append(future.result())
                print(f"  [{index}/{len(jobs)}] {job[0]} {job[1]} seed {job[2]} "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
    elapsed = time.perf_counter() - started
    command = "python -m benchmarks.goodhart " + " ".join(argv if argv is not None else sys.argv[1:])
    header = (
        f"Goodhart benchmark: `{command.strip()}` -- {len(jobs)} runs of {options.steps} GRPO steps, "
        f"{seeds} seeds, {options.workers} worker(s), {elapsed / 60:.1f} min on {os.cpu_count()} CPU(s) "
        f"({platform.machine()}). Values are mean +- std over seeds."
    )
    payload = {"command": command.strip(), "header": header, "seconds": elapsed, "seeds": seeds,
               "steps": options.steps}  # fmt: skip
    table = _write(options.out, runs, header, payload, plots=not options.no_plots)
    print(table)
    print(f"wrote {options.out}/goodhart.json, goodhart.md{'' if options.no_plots else ', goodhart_*.png'} "
          f"({elapsed:.0f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
