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
