"""Import time of loopguard's core next to ``import numpy``, and the start-up of ``loopguard report``.

Usage::

    python benchmarks/import_time.py                  # 15 runs (about 20 s)
    python benchmarks/import_time.py --runs 3 --out /tmp/import_time.json   # smoke test

Each run starts a new interpreter (``python -c``) that times, with ``time.perf_counter``, first
``import numpy`` and then, in the same process, ``import loopguard`` followed by the first use of its core
(``from loopguard import Guard, MitigationLog, shape_reward, signals, tap``: the Guard, controllers, kernels
and log, everything but the adapters; ``import loopguard`` alone loads only the exceptions and every other
name on first access). The loopguard time is what loopguard adds on top of numpy (its own modules, attrs,
...), which every user of it pays at start-up. The goal: at most 3x the numpy time, on the medians over
``--runs`` runs; the bare ``import loopguard`` is reported beside it.

Bytecode is cached, as after ``pip install``: the runs share a temporary ``PYTHONPYCACHEPREFIX`` (nothing is
written into the source tree, and a ``PYTHONDONTWRITEBYTECODE`` in the environment is overridden) and an
untimed first run fills it. Each run also lists which heavy modules the core left loaded (scipy.stats,
scikit-learn, torch, transformers: none is expected); a last run under ``-X importtime`` lists the modules
that take the most time after numpy.

``loopguard report LOG`` prints a text summary of a mitigation log, so it should start about as fast as Python
does: each run also starts a fresh interpreter that runs ``from loopguard.cli import main; main(["report",
LOG])`` on a small log (a 20-step run written with ``MitigationLog``), timing the import and the command
in-process and the whole process by the wall clock, next to the wall clock of a bare ``python -c pass``.
It lists the heavy modules the command left loaded (numpy, scipy, scikit-learn, torch, ...: none is
expected; ``tests/test_report.py`` checks scipy, scikit-learn and torch).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "import_time.json"
TARGET_RATIO = 3.0
HEAVY = ("scipy.stats", "sklearn", "torch", "transformers", "pandas", "matplotlib")
REPORT_HEAVY = ("numpy", "scipy", "sklearn", "torch", "transformers", "pandas", "matplotlib")
LOG_STEPS = 20
CORE = "from loopguard import Guard, MitigationLog, shape_reward, signals, tap"

_PROBE = f"""
import json, sys, time
began = time.perf_counter()
import numpy
numpy_done = time.perf_counter()
import loopguard
imported = time.perf_counter()
{CORE}
loopguard_done = time.perf_counter()
print(json.dumps({{
    "numpy_s": numpy_done - began,
    "import_s": imported - numpy_done,
    "loopguard_s": loopguard_done - numpy_done,
    "heavy": [name for name in {HEAVY!r} if name in sys.modules],
}}))
"""


_REPORT_PROBE = f"""
import contextlib, io, json, sys, time
began = time.perf_counter()
from loopguard.cli import main
imported = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()) as text:
    status = main(["report", sys.argv[1]])
done = time.perf_counter()
print(json.dumps({{
    "import_s": imported - began,
    "command_s": done - imported,
    "status": status,
    "lines": len(text.getvalue().splitlines()),
    "heavy": [name for name in {REPORT_HEAVY!r} if name in sys.modules],
}}))
"""


def _environment(cache: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = cache
    return env


def _python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run a fresh interpreter in the repository root (so ``import loopguard`` is this checkout)."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=True, cwd=ROOT, env=env, timeout=120
    )


def _probe(env: dict[str, str]) -> dict[str, Any]:
    return json.loads(_python(env, "-c", _PROBE).stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _write_log(path: Path) -> None:
    """A small mitigation log: a 20-step run that trips once and raises beta (what ``report`` is run on)."""
    from loopguard.log import MitigationLog

    log = MitigationLog(path)
    for step in range(1, LOG_STEPS + 1):
        hack = step in (12, 13)
        log.append(
            {
                "step": step,
                "mode": "kl_control",
                "verdict": "HACK" if hack else "OK",
                "vote": 0.5 if hack else 0.02,
                "signals": {"repetition": 0.5 if hack else 0.02},
                "beta_before": 0.06 if step == 13 else 0.04,
                "beta_after": 0.06 if step in (12, 13) else 0.04,
                "action": "raise_beta" if step == 12 else "lower_beta" if step == 14 else "none",
                "explanation": f"step {step}: {'HACK (vote 0.50 >= 0.30)' if hack else 'OK'}.",
            }
        )


def _wall_ms(env: dict[str, str], *args: str) -> float:
    began = time.perf_counter()
    _python(env, *args)
    return (time.perf_counter() - began) * 1e3


def _report_probe(env: dict[str, str], log: Path) -> dict[str, Any]:
    """One fresh interpreter running ``loopguard report LOG``: in-process times, wall clock, modules left."""
    began = time.perf_counter()
    done = _python(env, "-c", _REPORT_PROBE, str(log))
    wall_ms = (time.perf_counter() - began) * 1e3
    run: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    run["wall_ms"] = wall_ms
    run["python_wall_ms"] = _wall_ms(env, "-c", "pass")
    return run


def _slowest_modules(env: dict[str, str], top: int) -> list[dict[str, Any]]:
    """The ``top`` modules imported after numpy with the largest self time (``-X importtime``), in ms."""
    done = _python(env, "-X", "importtime", "-c", f"import numpy; import loopguard; {CORE}")
    rows: list[dict[str, Any]] = []
    after_numpy = False
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        self_us, cumulative_us, name = (part.strip() for part in line[len("import time:") :].split("|"))
        if not self_us.isdigit():
            continue  # the header line
        if after_numpy:
            rows.append(
                {"module": name, "self_ms": int(self_us) / 1e3, "cumulative_ms": int(cumulative_us) / 1e3}
            )
        elif name == "numpy":
            after_numpy = True
    return sorted(rows, key=lambda row: -row["self_ms"])[:top]


def _table(numpy_ms: float, import_ms: float, loopguard_ms: float, ratio: float, runs: int) -> str:
    verdict = "yes" if ratio <= TARGET_RATIO else "NO"
    return "\n".join(
        [
            f"| import (median of {runs} fresh interpreters) | ms |",
            "|---|---:|",
            f"| `import numpy` | {numpy_ms:.1f} |",
            f"| `import loopguard` (after numpy) | {import_ms:.1f} |",
            f"| `import loopguard` + its core ({CORE.split(' import ')[1]}) | {loopguard_ms:.1f} |",
            f"| ratio loopguard / numpy | {ratio:.2f} |",
            f"| within {TARGET_RATIO:g}x | {verdict} |",
        ]
    )


def _report_table(report: dict[str, Any], runs: int) -> str:
    return "\n".join(
        [
            f"| `loopguard report LOG` ({LOG_STEPS}-step log; median of {runs} fresh interpreters) | ms |",
            "|---|---:|",
            f"| `from loopguard.cli import main` | {report['import_ms']:.1f} |",
            f"| `main(['report', LOG])` | {report['command_ms']:.1f} |",
            f"| whole process (wall clock) | {report['wall_ms']:.1f} |",
            f"| bare `python -c pass` (wall clock) | {report['python_wall_ms']:.1f} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15, help="timed interpreters (median); default 15")
    parser.add_argument("--top", type=int, default=12, help="slowest modules listed from -X importtime")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="loopguard-pycache-") as cache:
        env = _environment(cache)
        log = Path(cache) / "mitigation_log.jsonl"
        _write_log(log)
        _probe(env)  # untimed: compiles and caches the bytecode of numpy, loopguard and their imports
        _report_probe(env, log)  # untimed: the same for the modules the report command imports
        runs = [_probe(env) for _ in range(args.runs)]
        report_runs = [_report_probe(env, log) for _ in range(args.runs)]
        slowest = _slowest_modules(env, args.top)
    numpy_ms = statistics.median(run["numpy_s"] for run in runs) * 1e3
    import_ms = statistics.median(run["import_s"] for run in runs) * 1e3
    loopguard_ms = statistics.median(run["loopguard_s"] for run in runs) * 1e3
    ratio = loopguard_ms / numpy_ms
    heavy = sorted({name for run in runs for name in run["heavy"]})
    table = _table(numpy_ms, import_ms, loopguard_ms, ratio, args.runs)
    report = {
        "import_ms": statistics.median(run["import_s"] for run in report_runs) * 1e3,
        "command_ms": statistics.median(run["command_s"] for run in report_runs) * 1e3,
        "wall_ms": statistics.median(run["wall_ms"] for run in report_runs),
        "python_wall_ms": statistics.median(run["python_wall_ms"] for run in report_runs),
    }
    report_heavy = sorted({name for run in report_runs for name in run["heavy"]})
    if any(run["status"] != 0 or run["lines"] < 2 for run in report_runs):
        msg = f"`loopguard report` did not print a summary: {report_runs[0]}"
        raise RuntimeError(msg)
    report_table = _report_table(report, args.runs)
    print(table)
    print()
    print("heavy modules left loaded by loopguard's core: " + (", ".join(heavy) or "none"))
    print()
    print(report_table)
    print()
    print("heavy modules left loaded by `loopguard report LOG`: " + (", ".join(report_heavy) or "none"))
    print(
        "slowest modules after numpy (self ms): "
        + ", ".join(f"{r['module']} {r['self_ms']:.1f}" for r in slowest)
    )
    result = {
        "benchmark": "import_time",
        "command": "python benchmarks/import_time.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "runs": args.runs,
        "numpy_ms": numpy_ms,
        "import_ms": import_ms,
        "core": CORE,
        "loopguard_ms": loopguard_ms,
        "ratio": ratio,
        "per_run_ratio_median": statistics.median(run["loopguard_s"] / run["numpy_s"] for run in runs),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "heavy_modules_loaded": heavy,
        "slowest_modules_after_numpy": slowest,
        "per_run_ms": [
            {
                "numpy": run["numpy_s"] * 1e3,
                "import": run["import_s"] * 1e3,
                "loopguard": run["loopguard_s"] * 1e3,
            }
            for run in runs
        ],
        "bytecode": "cached (shared temporary PYTHONPYCACHEPREFIX, filled by an untimed first run)",
        "report": {
            "command": "from loopguard.cli import main; main(['report', LOG])",
            "log_steps": LOG_STEPS,
            **report,
            "heavy_modules_loaded": report_heavy,
            "per_run_ms": [
                {
                    "import": run["import_s"] * 1e3,
                    "command": run["command_s"] * 1e3,
                    "wall": run["wall_ms"],
                    "python_wall": run["python_wall_ms"],
                }
                for run in report_runs
            ],
            "markdown": report_table,
        },
        "markdown": table,
        "elapsed_s": time.perf_counter() - began,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
