import re
import subprocess
import sys

import attrs
import pytest

import loopguard.control as control
from loopguard import ConfigError
from loopguard.control import ControlOutput

EXPECTED = [
    "AdaptiveKL",
    "AdaptiveKLState",
    "BangBang",
    "BangBangState",
    "ControlOutput",
    "EscalationLadder",
    "LadderOutput",
    "LadderState",
    "PIDLagrangian",
    "PIDLagrangianState",
]


def test_public_names():
    assert control.__all__ == EXPECTED
    for name in EXPECTED:
        assert getattr(control, name).__module__.startswith("loopguard.control")


def test_import_is_light():
    code = "import sys, loopguard.control; print(','.join(m for m in ('torch', 'transformers') if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("name", ["AdaptiveKL", "BangBang", "PIDLagrangian", "EscalationLadder"])
def test_configs_and_states_are_frozen(name):
    config = getattr(control, name)()
    state = config.init() if name == "EscalationLadder" else config.init(0.04)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.beta_ceil = 2.0  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        state.step = 5  # type: ignore[misc]


def test_control_output_shape():
    fields = [f.name for f in attrs.fields(ControlOutput)]
    assert fields == ["beta", "direction", "components", "reason"]
    for ctl, measurement in (
        (control.BangBang(), 0.5),
        (control.PIDLagrangian(), 0.5),
        (control.AdaptiveKL(), 3.0),
    ):
        output, _ = ctl.update(ctl.init(0.04), measurement)
        assert isinstance(output, ControlOutput)
        assert type(output.beta) is float
        assert output.direction in ("raise", "lower", "hold")
        assert all(isinstance(k, str) and type(v) is float for k, v in output.components.items())
        assert "0.04" in output.reason


def test_states_cannot_be_mixed_up_through_json():
    payload = control.BangBang().init(0.04).to_dict()
    with pytest.raises(
        ConfigError, match=re.escape("`state['kind']` must be 'PIDLagrangianState', got 'BangBangState'.")
    ):
        control.PIDLagrangianState.from_dict(payload)
