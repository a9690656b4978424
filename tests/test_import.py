"""`import loopguard` and `import loopguard.signals` must stay light: no torch, transformers, scipy.stats, sklearn."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "trl", "accelerate", "datasets", "matplotlib")
# imported where used (inside the kernels), never at import: together they cost ~1 s at start-up
SCIENTIFIC = ("scipy.stats", "sklearn", "scipy.signal", "scipy.linalg", "pandas")


def _loaded_after(statement, names):
    code = f"import sys\n{statement}\nprint(','.join(name for name in {names!r} if name in sys.modules))\n"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return result.stdout.strip()


@pytest.mark.parametrize("module", ["loopguard", "loopguard.signals", "loopguard.adapters"])
def test_import_does_not_pull_heavy_dependencies(module):
    loaded = _loaded_after(f"import {module}", HEAVY)
    assert loaded == "", f"`import {module}` imported {loaded}"


@pytest.mark.parametrize("module", ["loopguard", "loopguard.signals"])
def test_import_leaves_scipy_stats_and_sklearn_out(module):
    loaded = _loaded_after(f"import {module}", (*SCIENTIFIC, "importlib.metadata"))
    assert loaded == "", f"`import {module}` imported {loaded}"


def test_kernels_import_scipy_and_sklearn_where_they_use_them():
    # the check above proves something only if the kernels still reach scipy / sklearn when called
    statement = (
        "from loopguard.signals import cluster_separation_index, robust_baseline\n"
        "robust_baseline([1.0, 2.0, 4.0])\n"
        "cluster_separation_index([[0.0, 0.0], [0.0, 1.0]], [[3.0, 4.0]], eps=2.0, min_samples=2)"
    )
    assert _loaded_after(statement, ("scipy.stats", "sklearn")) == "scipy.stats,sklearn"


def test_the_loop_adapters_are_exported_lazily_and_without_torch():
    statement = (
        "import loopguard\n"
        "assert 'loopguard.adapters.loop' not in sys.modules\n"
        "from loopguard import Applied, LoopGuard, apply_decision\n"
        "from loopguard.adapters import RankSync, rank_sync, read_state, register_state"
    )
    assert _loaded_after(statement, HEAVY) == ""


def test_heavy_modules_are_installed_so_the_check_means_something():
    # The checks above only prove something if torch, scipy.stats and sklearn could have been imported.
    code = "import importlib.util as u; print([u.find_spec(m) is not None for m in ('torch', 'scipy', 'sklearn')])"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[True, True, True]"


def test_public_names_resolve():
    # (ruff's RUF022 keeps each __all__ sorted; this checks every listed name exists.)
    import loopguard
    import loopguard.adapters
    import loopguard.adapters.distributed
    import loopguard.signals

    for module in (loopguard, loopguard.signals, loopguard.adapters, loopguard.adapters.distributed):
        names = list(module.__all__)
        assert len(names) == len(set(names)), f"{module.__name__}.__all__ repeats a name"
        for name in names:
            assert hasattr(module, name), f"{module.__name__}.{name} is listed but missing"


def test_every_entry_point_has_one_public_home():
    import loopguard
    from loopguard import adapters
    from loopguard.adapters import _distributed, accelerate_hooks, distributed, loop

    for name in ("Applied", "LoopGuard", "apply_decision"):
        assert getattr(loopguard, name) is getattr(adapters, name) is getattr(loop, name)
    for name in ("rank_sync", "read_state", "register_state"):
        assert getattr(adapters, name) is getattr(accelerate_hooks, name)
    for name in _distributed.__all__:
        assert getattr(distributed, name) is getattr(_distributed, name)
    assert adapters.RankSync is distributed.RankSync


def test_version_is_read_on_first_access():
    import loopguard

    assert isinstance(loopguard.__version__, str)
    assert loopguard.__version__


def test_import_time_benchmark_runs(tmp_path):
    # a smoke test of benchmarks/import_time.py (no timing is asserted: numbers live in benchmarks/)
    out = tmp_path / "import_time.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "import_time.py"),
            *("--runs", "2", "--top", "3", "--out", out),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    report = json.loads(out.read_text())
    assert report["runs"] == 2
    assert report["numpy_ms"] > 0
    assert report["loopguard_ms"] > 0
    assert report["ratio"] == pytest.approx(report["loopguard_ms"] / report["numpy_ms"])
    assert report["meets_target"] == (report["ratio"] <= 3.0)
    assert report["heavy_modules_loaded"] == []
    assert 0 < report["import_ms"] < report["loopguard_ms"]
    assert len(report["slowest_modules_after_numpy"]) == 3
    started = report["report"]
    assert started["import_ms"] > 0
    assert started["command_ms"] > 0
    assert started["wall_ms"] > started["python_wall_ms"] > 0
    assert started["heavy_modules_loaded"] == []
    assert len(started["per_run_ms"]) == 2
