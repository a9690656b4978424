"""The README's main example runs and shows what it claims: healthy batch calm, hacked batch flagged."""

import pathlib
import runpy

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_signals_demo_separates_healthy_from_hacked(capsys):
    runpy.run_path(str(ROOT / "examples" / "signals_demo.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    rows = {line[:31].strip(): (line[31:61].strip(), line[61:].strip()) for line in lines[2:]}
    healthy_worst, hacked_worst = rows["worst completion's repetition"]
    assert healthy_worst.endswith("(OK)")
    assert hacked_worst.endswith("(TRAP)")
    healthy_div, hacked_div = rows["distinct-2, drop vs warm-up"]
    assert healthy_div.endswith("(OK)")
    assert not hacked_div.endswith("(OK)")
    healthy_rho, hacked_rho = (float(v) for v in rows["reward-length Spearman rho"])
    assert hacked_rho > healthy_rho + 0.3
    healthy_var, hacked_var = (float(v) for v in rows["ensemble disagreement (var)"])
    assert hacked_var > 10 * healthy_var
    healthy_csi, hacked_csi = (float(v) for v in rows["InfoRM CSI (per point)"])
    assert hacked_csi > healthy_csi + 1.0


def test_iterative_dpo_example_promotes_honest_rounds_and_blocks_the_hack():
    import os
    import re
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "iterative_dpo.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=True,
    )
    honest, marker, buggy = result.stdout.partition("== reward model with a w0 bug")
    assert marker, result.stdout
    # The honest run: every round passes every gate.
    assert "3 round(s) finished, 3 promoted" in honest, honest
    assert "blocked:" not in honest, honest
    # The buggy run: the gold audit blocks the hacked round(s), and the policy the run ends on is the last
    # one that passed (which round the hack first shows in is the example's dynamics, not the gates').
    assert "blocked: gold score drop" in buggy, buggy
    promoted = [int(r) for r in re.findall(r"^\s*(\d+)\s+yes\s", buggy, flags=re.MULTILINE)]
    kept = f"buggy/round-{max(promoted):02d}/model" if promoted else "buggy/initial/model"
    assert re.search(re.escape(kept) + r"(; it stays the result|\.)", buggy), buggy
