"""The benchmark scripts run end to end (smoke test with tiny sizes) and write what they promise."""

import json
import pathlib
import runpy
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(script, args, monkeypatch):
    monkeypatch.setattr(sys, "argv", [script, *args])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "benchmarks" / script), run_name="__main__")
    assert exit_info.value.code == 0


def test_kernels_benchmark_quick(tmp_path, monkeypatch):
    _run("kernels.py", ["--quick", "--out", str(tmp_path)], monkeypatch)
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
