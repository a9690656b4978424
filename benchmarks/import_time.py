"""Import time of ``import loopguard`` next to ``import numpy``, in fresh interpreters; JSON + a table.

Usage::

    python benchmarks/import_time.py                  # 15 runs (about 10 s)
    python benchmarks/import_time.py --runs 3 --out /tmp/import_time.json   # smoke test

Each run starts a new interpreter (``python -c``) that times, with ``time.perf_counter``, first
``import numpy`` and then ``import loopguard`` in the same process: the loopguard time is what loopguard adds
on top of numpy (its own modules, attrs, ...), which every user of it pays at start-up. The goal: at most
3x the numpy time, on the medians over ``--runs`` runs.

Bytecode is cached, as after ``pip install``: the runs share a temporary ``PYTHONPYCACHEPREFIX`` (nothing is
written into the source tree, and a ``PYTHONDONTWRITEBYTECODE`` in the environment is overridden) and an
untimed first run fills it. Each run also lists which heavy modules ``import loopguard`` left loaded
(scipy.stats, scikit-learn, torch, transformers: none is expected); a last run under ``-X importtime``
lists the modules that take the most time after numpy.
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

_PROBE = f"""
import json, sys, time
began = time.perf_counter()
import numpy
numpy_done = time.perf_counter()
import loopguard
loopguard_done = time.perf_counter()
print(json.dumps({{
    "numpy_s": numpy_done - began,
    "loopguard_s": loopguard_done - numpy_done,
    "heavy": [name for name in {HEAVY!r} if name in sys.modules],
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


def _slowest_modules(env: dict[str, str], top: int) -> list[dict[str, Any]]:
    """The ``top`` modules imported after numpy with the largest self time (``-X importtime``), in ms."""
    done = _python(env, "-X", "importtime", "-c", "import numpy; import loopguard")
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


def _table(numpy_ms: float, loopguard_ms: float, ratio: float, runs: int) -> str:
    verdict = "yes" if ratio <= TARGET_RATIO else "NO"
    return "\n".join(
        [
            f"| import (median of {runs} fresh interpreters) | ms |",
            "|---|---:|",
            f"| `import numpy` | {numpy_ms:.1f} |",
            f"| `import loopguard` (after numpy) | {loopguard_ms:.1f} |",
            f"| ratio loopguard / numpy | {ratio:.2f} |",
            f"| within {TARGET_RATIO:g}x | {verdict} |",
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
        _probe(env)  # untimed: compiles and caches the bytecode of numpy, loopguard and their imports
        runs = [_probe(env) for _ in range(args.runs)]
        slowest = _slowest_modules(env, args.top)
    numpy_ms = statistics.median(run["numpy_s"] for run in runs) * 1e3
    loopguard_ms = statistics.median(run["loopguard_s"] for run in runs) * 1e3
    ratio = loopguard_ms / numpy_ms
    heavy = sorted({name for run in runs for name in run["heavy"]})
    table = _table(numpy_ms, loopguard_ms, ratio, args.runs)
    print(table)
    print()
    print("heavy modules left loaded by `import loopguard`: " + (", ".join(heavy) or "none"))
    print(
        "slowest modules after numpy (self ms): "
        + ", ".join(f"{r['module']} {r['self_ms']:.1f}" for r in slowest)
    )
    result = {
        "benchmark": "import_time",
        "command": "python benchmarks/import_time.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "runs": args.runs,
        "numpy_ms": numpy_ms,
        "loopguard_ms": loopguard_ms,
        "ratio": ratio,
        "per_run_ratio_median": statistics.median(run["loopguard_s"] / run["numpy_s"] for run in runs),
        "target_ratio": TARGET_RATIO,
        "meets_target": ratio <= TARGET_RATIO,
        "heavy_modules_loaded": heavy,
        "slowest_modules_after_numpy": slowest,
        "per_run_ms": [
            {"numpy": run["numpy_s"] * 1e3, "loopguard": run["loopguard_s"] * 1e3} for run in runs
        ],
        "bytecode": "cached (shared temporary PYTHONPYCACHEPREFIX, filled by an untimed first run)",
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
