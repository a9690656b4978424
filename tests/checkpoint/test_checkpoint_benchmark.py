"""benchmarks/checkpoint.py runs end to end on a tiny size and writes the JSON and table it promises."""

import json
import pathlib
import runpy
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_checkpoint_benchmark_smoke(tmp_path, monkeypatch):
    out = tmp_path / "checkpoint.json"
    monkeypatch.setattr(
        sys, "argv", ["checkpoint.py", "--sizes", "0.05M", "--repeats", "1", "--out", str(out)]
    )
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(ROOT / "benchmarks" / "checkpoint.py"), run_name="__main__")
    assert exit_info.value.code == 0
    report = json.loads(out.read_text())
    modes = [row["mode"] for row in report["rows"]]
    assert modes == ["torch.save / torch.load", "CheckpointManager (disk)", "CheckpointManager (in_memory)"]
    for row in report["rows"]:
        assert row["save_s"] > 0
        assert row["restore_s"] > 0
        assert row["save_memory"]["peak_rss_delta_mib"] >= 0
    assert report["rows"][1]["bytes"] >= report["rows"][0]["bytes"] * 0.9  # same tensors on disk
    assert "| size | params | mode |" in report["table"]
