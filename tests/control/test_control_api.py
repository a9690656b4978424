import json
import math
import re
import subprocess
import sys

import attrs
import numpy as np
import pytest

import loopguard.control as control
from loopguard import ConfigError, InputError, LoopguardTypeError, StateError
from loopguard.control import (
    AdaptiveKL,
    AdaptiveKLState,
    BangBang,
    BangBangState,
    ControlInput,
    ControlOutput,
    EscalationLadder,
    JSONState,
    KLController,
    LadderState,
    PIDLagrangian,
    PIDLagrangianState,
)

EXPECTED = [
    "AdaptiveKL",
    "AdaptiveKLState",
    "BangBang",
    "BangBangState",
    "ControlInput",
    "ControlOutput",
    "EscalationLadder",
    "JSONState",
    "KLController",
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


def _signal(ctl, value):
    return ControlInput(kl=value, batch_size=8) if isinstance(ctl, AdaptiveKL) else ControlInput(vote=value)


def test_control_output_shape():
    fields = [f.name for f in attrs.fields(ControlOutput)]
    assert fields == ["beta", "direction", "components", "reason", "note"]
    for ctl, measurement in ((BangBang(), 0.5), (PIDLagrangian(), 0.5), (AdaptiveKL(), 3.0)):
        output, _ = ctl.update(ctl.init(0.04), _signal(ctl, measurement))
        assert isinstance(output, ControlOutput)
        assert type(output.beta) is float
        assert output.direction in ("raise", "lower", "hold")
        assert all(isinstance(k, str) and type(v) is float for k, v in output.components.items())
        assert "0.04" in output.reason
        assert output.note is None


# ------------------------------------------------------------------------------ one interface, three controllers


@pytest.mark.parametrize(
    ("cls", "name", "acts_while_warming"),
    [
        (BangBang, "kl_control", False),
        (PIDLagrangian, "pid_lagrangian", False),
        (AdaptiveKL, "adaptive_kl", True),
    ],
)
def test_controllers_share_one_interface(cls, name, acts_while_warming):
    assert cls.name == name
    assert cls.acts_while_warming is acts_while_warming
    ctl = cls(beta_ceil=0.5)
    assert ctl.beta_ceil == 0.5
    assert isinstance(ctl, KLController)
    assert "name" not in [f.name for f in attrs.fields(cls)]  # a class variable, not a config field
    state = ctl.init(0.04)
    ctl.validate(state)
    output, new_state = ctl.update(state, _signal(ctl, 0.9), allow_lower=True)
    assert new_state.step == 1
    assert isinstance(output, ControlOutput)


def test_the_ladder_is_not_a_kl_controller():
    assert not isinstance(EscalationLadder(), KLController)
    assert not isinstance(object(), KLController)


def test_vote_and_kl_controllers_read_their_own_field():
    # BangBang / PID read vote and ignore kl; AdaptiveKL reads kl and ignores vote.
    bang, pid, adaptive = BangBang(dwell_steps=1), PIDLagrangian(), AdaptiveKL(rule="ppo")
    both = ControlInput(vote=0.9, kl=50.0, batch_size=4)
    assert bang.update(bang.init(0.04), both)[0] == bang.update(bang.init(0.04), ControlInput(vote=0.9))[0]
    assert pid.update(pid.init(0.04), both)[0] == pid.update(pid.init(0.04), ControlInput(vote=0.9))[0]
    out, _ = adaptive.update(adaptive.init(0.04), ControlInput(vote=0.0, kl=50.0, batch_size=4))
    assert out.beta == 0.08  # doubled: KL 50 > 1.5 x 6


# ------------------------------------------------------------------------------------------ ControlInput


def test_control_input_defaults_and_normalisation():
    signal = ControlInput()
    assert (signal.vote, signal.kl, signal.batch_size) == (0.0, None, None)
    signal = ControlInput(vote=np.float32(0.5), kl=np.float64(-0.01), batch_size=np.int64(16))
    assert type(signal.vote) is float
    assert type(signal.kl) is float
    assert type(signal.batch_size) is int
    assert signal.kl == -0.01  # kept as measured: AdaptiveKL clips, not the record


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"vote": 1.01}, InputError, "`vote` must be in [0, 1], got 1.01."),
        ({"vote": -0.5}, InputError, "`vote` must be in [0, 1], got -0.5."),
        ({"vote": math.nan}, InputError, "`vote` must be finite, got nan."),
        ({"vote": None}, LoopguardTypeError, "`vote` must be a real number, got None of type NoneType."),
        ({"vote": False}, LoopguardTypeError, "`vote` must be a real number (not bool), got False."),
        ({"kl": math.inf}, InputError, "`kl` must be finite, got inf."),
        ({"kl": "0.1"}, LoopguardTypeError, "`kl` must be a real number, got '0.1' of type str."),
        ({"batch_size": 0}, InputError, "`batch_size` must be >= 1, got 0."),
        ({"batch_size": 2.0}, LoopguardTypeError, "`batch_size` must be an integer, got 2.0 of type float."),
    ],
)
def test_control_input_validation_names_the_field(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ControlInput(**kwargs)


def test_control_input_is_frozen():
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ControlInput().vote = 0.5  # type: ignore[misc]


# ------------------------------------------------------------------------------------------ JSON states


def _states():
    bang, pid, adaptive, ladder = (
        BangBang(),
        PIDLagrangian(),
        AdaptiveKL(),
        EscalationLadder(rollback_patience=1),
    )
    bang_state = bang.update(bang.update(bang.init(0.01), ControlInput(vote=0.9))[1], ControlInput(vote=0.9))[
        1
    ]
    pid_state = pid.update(pid.update(pid.init(0.01), ControlInput(vote=0.9))[1], ControlInput(vote=0.2))[1]
    adaptive_state = adaptive.update(adaptive.init(0.01), ControlInput(kl=9.0, batch_size=64))[1]
    ladder_state = ladder.update(ladder.init(), hacking=True)[1]
    return [bang_state, pid_state, adaptive_state, ladder_state]


STATES = _states()
IDS = [type(s).__name__ for s in STATES]


@pytest.mark.parametrize("state", STATES, ids=IDS)
def test_json_base_round_trips_every_state(state):
    assert isinstance(state, JSONState)
    payload = state.to_dict()
    assert list(payload)[:2] == ["kind", "version"]
    assert payload["kind"] == type(state).__name__
    assert payload["version"] == 1
    assert list(payload)[2:] == [f.name for f in attrs.fields(type(state))]
    restored = type(state).from_dict(json.loads(json.dumps(payload)))
    assert restored == state
    assert restored.to_dict() == payload


def test_json_layout_is_unchanged():
    # A state saved before the JSON base existed still loads (the layout is the same key for key).
    saved = {
        "kind": "PIDLagrangianState",
        "version": 1,
        "step": 2,
        "base_beta": 0.01,
        "beta": 0.0213,
        "integral": 0.0075,
        "p_ema": 0.0245,
        "j_ema": 0.8675,
        "j_history": [0.9, 0.8675],
    }
    state = PIDLagrangianState.from_dict(saved)
    assert state.j_history == (0.9, 0.8675)
    assert type(state.integral) is float
    assert state.to_dict() == saved
    assert AdaptiveKLState.from_dict(
        {"kind": "AdaptiveKLState", "version": 1, "step": 3, "base_beta": 0.1, "beta": 1}
    ) == AdaptiveKLState(step=3, base_beta=0.1, beta=1.0)


@pytest.mark.parametrize("state", STATES, ids=IDS)
def test_json_base_refuses_an_unknown_key(state):
    payload = {**state.to_dict(), "surprise": 1}
    with pytest.raises(StateError, match=re.escape("got missing [], unexpected ['surprise'].")):
        type(state).from_dict(payload)


@pytest.mark.parametrize(
    ("state", "key", "message"),
    [
        (STATES[0], "beta", "`state.beta` must be finite, got nan."),
        (STATES[1], "integral", "`state.integral` must be finite, got nan."),
        (STATES[2], "base_beta", "`state.base_beta` must be finite, got nan."),
        (STATES[3], "step", "`state.step` must be an integer, got nan of type float."),
    ],
    ids=IDS,
)
def test_json_base_refuses_nan_naming_the_path(state, key, message):
    payload = {**state.to_dict(), key: math.nan}
    with pytest.raises(StateError, match=re.escape(message)):
        type(state).from_dict(payload)


def test_json_base_refuses_nan_inside_a_list_naming_the_index():
    payload = STATES[1].to_dict()
    payload["j_history"] = [0.5, math.nan]
    with pytest.raises(StateError, match=re.escape("`state.j_history[1]` must be finite, got nan.")):
        PIDLagrangianState.from_dict(payload)


def test_json_base_refuses_wrong_types_and_ranges_with_state_error():
    cases = [
        (BangBangState, "tripped", "yes", "`state.tripped` must be a bool, got 'yes' of type str."),
        (LadderState, "stop_step", 0, "`state.stop_step` must be >= 1, got 0."),
        (
            LadderState,
            "cooldown_left",
            True,
            "`state.cooldown_left` must be an integer (not bool), got True.",
        ),
        (AdaptiveKLState, "beta", -1.0, "`state.beta` must be > 0, got -1.0."),
        (PIDLagrangianState, "p_ema", math.inf, "`state.p_ema` must be finite, got inf."),
    ]
    by_type = {type(s): s for s in STATES}
    for state_type, key, value, message in cases:
        payload = {**by_type[state_type].to_dict(), key: value}
        with pytest.raises(StateError, match=re.escape(message)):
            state_type.from_dict(payload)


def test_building_a_state_directly_checks_the_same_rules_naming_the_field():
    with pytest.raises(ConfigError, match=re.escape("`beta` must be finite, got nan.")):
        AdaptiveKLState(step=0, base_beta=0.1, beta=math.nan)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`j_history` must be a list of numbers, got '0.5'")
    ):
        PIDLagrangianState(
            step=0, base_beta=0.1, beta=0.1, integral=0.0, p_ema=0.0, j_ema=0.0, j_history="0.5"
        )
    with pytest.raises(ConfigError, match=re.escape("`j_history[0]` must be in [0, 1], got 2.0.")):
        PIDLagrangianState(
            step=0, base_beta=0.1, beta=0.1, integral=0.0, p_ema=0.0, j_ema=0.0, j_history=[2.0]
        )


def test_states_cannot_be_mixed_up_through_json():
    payload = BangBang().init(0.04).to_dict()
    with pytest.raises(
        ConfigError, match=re.escape("`state['kind']` must be 'PIDLagrangianState', got 'BangBangState'.")
    ):
        PIDLagrangianState.from_dict(payload)
