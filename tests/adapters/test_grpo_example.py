"""The README's main example runs end to end and shows what it claims (about half a minute on 2 CPU cores)."""

import pathlib
import re
import runpy
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_grpo_guarded_example(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["grpo_guarded.py", "--output-dir", str(tmp_path)])
    runpy.run_path(str(ROOT / "examples" / "grpo_guarded.py"), run_name="__main__")
    out = capsys.readouterr().out
    rows = {}
    for label in ("before training", "after, plain GRPO", "after, with loopguard"):
        match = re.search(rf"^{re.escape(label)}\s+([\d.]+)\s+([\d.]+)", out, re.MULTILINE)
        assert match, out
        rows[label] = (float(match.group(1)), float(match.group(2)))
    plain_proxy, plain_gold = rows["after, plain GRPO"]
    guarded_proxy, guarded_gold = rows["after, with loopguard"]
    assert plain_proxy > 2.0
    assert plain_gold < 0.3
    assert guarded_gold > plain_gold + 0.3
    assert guarded_proxy < plain_proxy
    assert (tmp_path / "with_loopguard" / "mitigation_log.jsonl").is_file()
    assert "rollback" in out
