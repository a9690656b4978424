"""The benchmark scripts run end to end (smoke test with tiny sizes) and write what they promise."""

import json
import os
import pathlib
import runpy
import subprocess
import sys

import gloo_exit
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(script, args, monkeypatch):
    monkeypatch.setattr(sys, "argv", [script, *args])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "benchmarks" / script), run_name="__main__")
    assert exit_info.value.code == 0


def test_kernels_benchmark_quick(tmp_path, monkeypatch):
    _run("signal_kernels.py", ["--quick", "--out", str(tmp_path)], monkeypatch)
    report = json.loads((tmp_path / "kernels.json").read_text())
    kernels = {row["kernel"] for row in report["batch"]}
    assert {"ngram_repetition_rate", "distinct_n", "default signal set"} <= kernels
    assert {row["kernel"] for row in report["latent"]} == {"cluster_separation_index", "mahalanobis_outlier_fraction"}
    assert report["targets"]["default_set_1024x256_ms"] > 0
    assert "| kernel |" in (tmp_path / "kernels.md").read_text()


def test_change_detection_benchmark_small(tmp_path, monkeypatch):
    out = tmp_path / "change_detection.json"
    _run("change_detection.py", ["--runs", "50", "--out", str(out)], monkeypatch)
    assert json.loads(out.read_text())


def test_false_alarm_benchmark_small(tmp_path, monkeypatch):
    _run("false_alarms.py", ["--runs", "1", "--hack-runs", "1", "--workers", "1", "--out", str(tmp_path)], monkeypatch)
    report = json.loads((tmp_path / "false_alarms.json").read_text())
    assert len(report["healthy"]) == 6
    assert {row["scenario"] for row in report["hacks"]} == {"echo step", "echo ramp", "diversity ramp"}
    assert all(row["detected"] == 1 for row in report["hacks"] if row["scenario"] == "echo step")


def test_rollback_store_benchmark_quick(tmp_path, monkeypatch):
    _run("rollback_store.py", ["--quick", "--out", str(tmp_path)], monkeypatch)
    report = json.loads((tmp_path / "rollback_store.json").read_text())
    assert (report["keep_last"], report["in_memory_limit_bytes"]) == (3, 2 * 1024**3)
    rows = {row["setup"]: row for row in report["rows"]}
    assert rows["full, float32"]["holds_bytes"] == 12 * rows["full, float32"]["parameters"]  # weights + 2 moments
    assert rows["full, float32"]["one_process"] == "memory"
    lora = rows["LoRA r=16, bfloat16 base"]
    assert lora["holds_bytes"] == 12 * lora["trainable"]  # the float32 adapter and its moments, not the base
    for row in rows.values():  # the rule's estimate is what a checkpoint holds
        assert row["estimate_bytes"] == row["holds_bytes"], row
    for check in report["validation"]:  # the formula matches the bytes a real save writes (headers aside)
        assert 1.0 <= check["files_bytes"] / check["holds_bytes"] < 1.1, check
    assert "| model | set-up |" in (tmp_path / "rollback_store.md").read_text()


def test_rank_sync_benchmark_quick(tmp_path, monkeypatch):
    _run("rank_sync.py", ["--quick", "--out", str(tmp_path)], monkeypatch)
    report = json.loads((tmp_path / "rank_sync.json").read_text())
    default, takeover = report["default signals"], report["+ takeover"]
    assert takeover["payload_bytes"] > default["payload_bytes"] > 1000  # the state travels, takeover's n-grams too
    assert default["synced_ms"] > 0
    assert default["guard_ms"] > 0
    alpha, beta = report["alpha_s"], report["beta_bytes_per_s"]
    assert 0 < alpha < 1
    assert beta > 1e6
    # the alpha-beta model: 2 one-hop all-reduces and 2 broadcasts per tree level, log2(p) levels
    for ranks, levels in (("2", 1), ("64", 6), ("512", 9)):
        seconds = levels * (4 * alpha + (8 + default["payload_bytes"]) / beta)
        assert report["model"]["default signals"][ranks]["here_ms"] == pytest.approx(1e3 * seconds)


def test_sharded_checkpoint_benchmark_quick(tmp_path):
    # a subprocess: the script spawns a process group of one process, then one of two
    script = ROOT / "benchmarks" / "sharded_checkpoint.py"
    paths = os.pathsep.join([gloo_exit.install(tmp_path), str(ROOT)])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": paths}
    command = [sys.executable, str(script), "--quick", "--out", str(tmp_path), "--dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    # no process that exits through the interpreter (the script's own; its ranks leave without) keeps gloo's
    # threads running into it, where they can abort it after its work is done
    left = gloo_exit.reports(done.stderr)
    assert left, done.stderr[-4000:]
    assert all(threads == "[]" for _, threads in left), left
    assert "| DCP engine (sharded) | 2 |" in done.stdout
    report = json.loads((tmp_path / "sharded_checkpoint.json").read_text())
    assert report["parameters"] > 0
    one, two = report["one_process"], report["two_processes"]
    for timing in ("files_save_s", "files_restore_s", "engine_save_s", "engine_restore_s", "dcp_save_s"):
        assert one[timing] > 0, timing
    assert len(two) == 2
    # the model is split over the two ranks: each writes about half of what one process writes
    assert sum(entry["rank_bytes"] for entry in two) == pytest.approx(one["rank_bytes"], rel=0.05)
    assert report["ratios"]["engine_over_files_save"] == pytest.approx(one["engine_save_s"] / one["files_save_s"])
    eight, sixty_four = report["estimate_7b"]["8"], report["estimate_7b"]["64"]
    assert eight["bytes_per_rank"] == pytest.approx(7.0e9 * 12 / 8)
    assert eight["restore_s"] == pytest.approx(8 * sixty_four["restore_s"])


def test_false_alarm_benchmark_with_the_one_liners_judges(tmp_path, monkeypatch):
    args = ["--runs", "1", "--hack-runs", "1", "--workers", "1", "--ensemble", "--out", str(tmp_path)]
    _run("false_alarms.py", args, monkeypatch)
    report = json.loads((tmp_path / "false_alarms_ensemble.json").read_text())
    assert len(report["healthy"]) == 6
    blind = [row for row in report["hacks"] if row["scenario"] == "judges blind"]
    assert sorted((row["rewards"], row["batch"]) for row in blind) == [
        ("bernoulli", 16), ("bernoulli", 64), ("gaussian", 16), ("gaussian", 64),
    ]  # fmt: skip
    gaussian = next(row for row in blind if row["rewards"] == "gaussian" and row["batch"] == 64)
    assert gaussian["detected"] == 1  # the trained reward paid for what no judge sees: flagged after onset


def test_guard_replay_benchmark_small(tmp_path, monkeypatch):
    from loopguard import Guard

    step = Guard.step
    _run("guard_replay.py", ["--steps", "24", "--repeats", "2", "--out", str(tmp_path)], monkeypatch)
    report = json.loads((tmp_path / "guard_replay.json").read_text())
    assert (report["scenario"], report["steps"]) == ("token", 24)
    assert report["identical"] is True  # the Guard decides from its inputs alone: a replay decides the same
    assert report["in_loop_ms"] > 0
    assert report["warm_ms"] > 0
    assert Guard.step is step  # the timing wrapper is taken off again


@pytest.mark.parametrize("folder", ["benchmarks", "examples", "examples/recipes"])
def test_no_script_shadows_an_installed_module(folder):
    # a script run as `python <folder>/<name>.py` has its folder first on sys.path: a file named like an
    # installed module (benchmarks/kernels.py and the `kernels` package transformers imports) breaks imports
    import importlib.util

    scripts = sorted(path.stem for path in (ROOT / folder).glob("*.py") if path.stem != "__init__")
    assert scripts
    shadowing = {}
    for name in scripts:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and not spec.origin.startswith(str(ROOT / folder)):
            shadowing[name] = spec.origin
    assert not shadowing, f"scripts named like installed modules: {shadowing}"
