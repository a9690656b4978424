"""The distillation benchmark runs end to end at a tiny size and writes its JSON and markdown."""

import json
import pathlib
import runpy
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_distill_benchmark_smoke(tmp_path, monkeypatch):
    pytest.importorskip(
        "trl.experimental.gold.gold_trainer", reason="TRL's experimental GOLD trainer is needed"
    )
    argv = ["distill.py", "--vocabs", "300", "--batch", "2", "--seq", "8", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "benchmarks" / "distill.py"), run_name="__main__")
    assert exit_info.value.code == 0
    report = json.loads((tmp_path / "distill.json").read_text())
    (row,) = report["rows"]
    assert row["vocab"] == 300
    assert row["loopguard"]["loss"] == pytest.approx(row["trl"]["loss"], abs=1e-6)
    assert row["loopguard"]["seconds"] > 0
    assert row["trl"]["seconds"] > 0
    assert "| V | loopguard time (s) |" in (tmp_path / "distill.md").read_text()
