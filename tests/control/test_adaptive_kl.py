import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, InputError, LoopguardTypeError, StateError
from loopguard.control import AdaptiveKL, AdaptiveKLState, BangBang, ControlInput, ControlOutput


def reference_ziegler(kls, n_steps, base, *, target, horizon, floor, ceil):
    """The adaptive controller as old TRL wrote it (numpy clip), plus loopguard's [floor, ceil] clamp."""
    value, out = base, []
    for kl, n in zip(kls, n_steps, strict=True):
        proportional_error = np.clip(kl / target - 1, -0.2, 0.2)
        value = float(np.clip(value * (1 + proportional_error * n / horizon), floor, ceil))
        out.append(value)
    return out


def run(controller, kls, base, n_steps=None, allow=None):
    state = controller.init(base)
    outputs, states = [], []
    for k, kl in enumerate(kls):
        n = 1 if n_steps is None else n_steps[k]
        signal = ControlInput(kl=kl, batch_size=n)
        output, state = controller.update(state, signal, allow_lower=True if allow is None else allow[k])
        outputs.append(output)
        states.append(state)
    return outputs, states


def test_ziegler_hand_computed():
    # base 0.1, target 6, horizon 100:
    #   KL 9, n 10:   e = clip(0.5) = 0.2,   beta = 0.1 * (1 + 0.2 * 10/100) = 0.102
    #   KL 3, n 10:   e = clip(-0.5) = -0.2, beta = 0.102 * 0.98 = 0.09996
    #   KL 6.6, n 5:  e = 0.1,               beta = 0.09996 * 1.005 = 0.1004598
    #   KL 6, n 50:   e = 0,                 hold
    outputs, _ = run(AdaptiveKL(target=6.0, horizon=100), [9.0, 3.0, 6.6, 6.0], 0.1, [10, 10, 5, 50])
    assert [o.beta for o in outputs] == pytest.approx([0.102, 0.09996, 0.1004598, 0.1004598], rel=1e-12)
    assert [o.direction for o in outputs] == ["raise", "lower", "raise", "hold"]
    assert outputs[0].components == pytest.approx(
        {"kl": 9.0, "target": 6.0, "error": 0.2, "factor": 1.02, "n_steps": 10.0, "base_beta": 0.1}
    )
    assert outputs[0].reason == (
        "raised beta 0.1 -> 0.102: KL 9 vs target 6 (error +0.500, clipped +0.200); "
        "factor 1 + (+0.200) x 10/100 = 1.02"
    )


def test_ppo_rule_hand_computed_including_boundaries():
    ctl = AdaptiveKL(target=6.0, rule="ppo")
    outputs, _ = run(ctl, [3.9, 4.0, 9.0, 9.01, 20.0], 0.1)
    assert [o.beta for o in outputs] == pytest.approx([0.05, 0.05, 0.05, 0.1, 0.2])
    assert [o.direction for o in outputs] == ["lower", "hold", "hold", "raise", "raise"]
    assert outputs[0].reason == "lowered beta 0.1 -> 0.05: KL 3.9 < target/1.5 = 4; halve"
    assert outputs[1].reason == "held beta 0.05: KL 4 within [target/1.5, 1.5 x target] around 6"
    assert outputs[3].reason == "raised beta 0.05 -> 0.1: KL 9.01 > 1.5 x target = 9; double"


def test_ppo_rule_ignores_n_steps():
    a, _ = run(AdaptiveKL(rule="ppo"), [20.0], 0.1, [1])
    b, _ = run(AdaptiveKL(rule="ppo"), [20.0], 0.1, [500])
    assert a[0].beta == b[0].beta == pytest.approx(0.2)


def test_it_goes_below_the_users_beta_which_is_its_job():
    outputs, _ = run(AdaptiveKL(target=6.0, horizon=10), [0.0] * 20, 0.1)
    assert outputs[-1].beta == pytest.approx(0.1 * 0.98**20)
    assert outputs[-1].beta < 0.1


def test_clamped_at_floor_and_ceiling_never_zero():
    ctl = AdaptiveKL(horizon=1, beta_floor=0.01, beta_ceil=0.5)
    out, state = ctl.update(
        ctl.init(0.1), ControlInput(kl=0.0, batch_size=10)
    )  # factor 1 - 0.2 * 10 = -1: the floor catches it
    assert out.beta == 0.01
    assert out.reason.startswith("lowered beta 0.1 -> 0.01 (at the floor): ")
    out, _ = ctl.update(state, ControlInput(kl=0.0, batch_size=10))
    assert out.beta == 0.01
    assert out.direction == "hold"
    out, _ = ctl.update(ctl.init(0.4), ControlInput(kl=100.0, batch_size=10))
    assert out.beta == 0.5
    assert "(at the ceiling)" in out.reason


def test_allow_lower_false():
    ctl = AdaptiveKL(rule="ppo")
    out, state = ctl.update(ctl.init(0.1), ControlInput(kl=0.0, batch_size=1), allow_lower=False)
    assert out.beta == 0.1
    assert out.direction == "hold"
    assert out.reason.startswith(
        "held beta 0.1: the controller would lower it to 0.05, but lowering is not allowed"
    )
    assert state.beta == 0.1


@st.composite
def configs(draw):
    floor = draw(st.floats(1e-6, 0.05))
    ceil = draw(st.floats(floor * 1.01, 2.0))
    ctl = AdaptiveKL(
        target=draw(st.floats(0.01, 20.0)),
        horizon=draw(st.integers(1, 20_000)),
        beta_floor=floor,
        beta_ceil=ceil,
        rule=draw(st.sampled_from(["ziegler", "ppo"])),
    )
    return ctl, draw(st.floats(floor, ceil))


steps_st = st.lists(st.tuples(st.floats(0.0, 100.0), st.integers(1, 50_000), st.booleans()), max_size=50)


@settings(max_examples=50, deadline=None)
@given(configs(), steps_st)
def test_bounds_reference_and_allow_lower(config, steps):
    ctl, base = config
    kls, ns, allow = [s[0] for s in steps], [s[1] for s in steps], [s[2] for s in steps]
    outputs, _ = run(ctl, kls, base, ns, allow)
    previous = base
    for output, allowed in zip(outputs, allow, strict=True):
        assert 0 < ctl.beta_floor <= output.beta <= ctl.beta_ceil
        assert output.direction == (
            "raise" if output.beta > previous else "lower" if output.beta < previous else "hold"
        )
        if not allowed:
            assert output.direction != "lower"
        previous = output.beta
    if ctl.rule == "ziegler":
        expected = reference_ziegler(
            kls, ns, base, target=ctl.target, horizon=ctl.horizon, floor=ctl.beta_floor, ceil=ctl.beta_ceil
        )
        mask_all_allowed = all(allow)
        if mask_all_allowed:
            assert [o.beta for o in outputs] == pytest.approx(expected, rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(configs(), st.floats(0.0, 100.0), st.floats(0.0, 100.0), st.integers(1, 1000))
def test_monotone_in_kl_and_on_target_holds(config, kl_a, kl_b, n):
    ctl, base = config
    state = ctl.init(base)
    low, high = sorted((kl_a, kl_b))
    low_out, _ = ctl.update(state, ControlInput(kl=low, batch_size=n))
    high_out, _ = ctl.update(state, ControlInput(kl=high, batch_size=n))
    assert low_out.beta <= high_out.beta
    out, _ = ctl.update(state, ControlInput(kl=ctl.target, batch_size=n))
    assert out.beta == base
    assert out.direction == "hold"


@settings(max_examples=50, deadline=None)
@given(configs(), steps_st, st.lists(st.floats(0.0, 100.0), min_size=1, max_size=20))
def test_json_round_trip_mid_sequence_gives_identical_future(config, before, after):
    ctl, base = config
    state = ctl.init(base)
    for kl, n, allowed in before:
        _, state = ctl.update(state, ControlInput(kl=kl, batch_size=n), allow_lower=allowed)
    restored = AdaptiveKLState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    for kl in after:
        out_a, state = ctl.update(state, ControlInput(kl=kl, batch_size=7))
        out_b, restored = ctl.update(restored, ControlInput(kl=kl, batch_size=7))
        assert out_a == out_b
        assert state == restored


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"target": 0.0}, ConfigError, "`target` must be > 0, got 0.0."),
        ({"target": True}, LoopguardTypeError, "`target` must be a real number (not bool), got True."),
        ({"horizon": 0}, ConfigError, "`horizon` must be >= 1, got 0."),
        ({"horizon": 1e4}, LoopguardTypeError, "`horizon` must be an integer, got 10000.0 of type float."),
        ({"rule": "pid"}, ConfigError, "`rule` must be one of 'ppo', 'ziegler', got 'pid'."),
        ({"rule": 1}, LoopguardTypeError, "`rule` must be a name string, got 1 of type int."),
        ({"beta_floor": 2.0}, ConfigError, "`beta_ceil` must be > beta_floor (2), got 1.0."),
    ],
)
def test_bad_config(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        AdaptiveKL(**kwargs)


@pytest.mark.parametrize(
    ("kl", "batch_size", "error", "message"),
    [
        (float("nan"), 1, InputError, "`kl` must be finite, got nan."),
        (float("inf"), 1, InputError, "`kl` must be finite, got inf."),
        (True, 1, LoopguardTypeError, "`kl` must be a real number (not bool), got True."),
        ("0.1", 1, LoopguardTypeError, "`kl` must be a real number, got '0.1' of type str."),
        (1.0, 0, InputError, "`batch_size` must be >= 1, got 0."),
        (1.0, 1.0, LoopguardTypeError, "`batch_size` must be an integer, got 1.0 of type float."),
        (1.0, True, LoopguardTypeError, "`batch_size` must be an integer (not bool), got True."),
    ],
)
def test_bad_kl_or_batch_size_is_refused_when_the_input_is_built(kl, batch_size, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ControlInput(kl=kl, batch_size=batch_size)


def test_bad_update_arguments():
    ctl = AdaptiveKL()
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`allow_lower` must be a bool, got 'no' of type str.")
    ):
        ctl.update(ctl.init(0.1), ControlInput(kl=1.0, batch_size=1), allow_lower="no")
    with pytest.raises(
        LoopguardTypeError,
        match=re.escape(
            "`signal` must be a ControlInput (e.g. ControlInput(vote=0.4)), got 1.0 of type float."
        ),
    ):
        ctl.update(ctl.init(0.1), 1.0)
    with pytest.raises(
        InputError,
        match=re.escape(
            "`signal.batch_size` must be the number of completions in the step (an int >= 1) when `signal.kl` is given"
        ),
    ):
        ctl.update(ctl.init(0.1), ControlInput(kl=1.0))
    with pytest.raises(InputError, match=re.escape("`signal.batch_size` must be")):
        AdaptiveKL(rule="ppo").update(ctl.init(0.1), ControlInput(kl=1.0))  # required for either rule


def test_no_kl_holds_beta_leaves_the_state_unchanged_and_carries_a_note():
    ctl = AdaptiveKL(target=6.0, horizon=100)
    _, state = ctl.update(ctl.init(0.1), ControlInput(kl=9.0, batch_size=10))
    assert state.step == 1
    assert state.beta == pytest.approx(0.102)
    out, same = ctl.update(state, ControlInput(vote=0.9, batch_size=10), allow_lower=False)
    assert same is state
    assert out == ControlOutput(
        beta=state.beta,
        direction="hold",
        components={},
        reason="",
        note="adaptive_kl holds beta: this step has no kl",
    )
    out, later = ctl.update(same, ControlInput(kl=9.0, batch_size=10))  # the next step with a KL goes on
    assert later.step == 2
    assert out.note is None
    with pytest.raises(LoopguardTypeError, match=re.escape("`state` must be an AdaptiveKLState")):
        ctl.update(BangBang().init(0.1), ControlInput())  # a step with no KL still checks the state


def test_negative_kl_is_clipped_to_zero():
    # A k1 estimate can dip below 0 on one batch; the controller reads it as a KL of 0 (the Guard used to clip).
    ctl = AdaptiveKL(target=6.0, horizon=100)
    state = ctl.init(0.1)
    out, new_state = ctl.update(state, ControlInput(kl=-0.05, batch_size=10))
    zero, zero_state = ctl.update(state, ControlInput(kl=0.0, batch_size=10))
    assert out.components["kl"] == 0.0
    assert out.reason == zero.reason
    assert out.reason.startswith("lowered beta 0.1 -> 0.098: KL 0 vs target 6 (error -1.000, clipped -0.200)")
    assert out.beta == pytest.approx(0.1 * (1 - 0.2 * 10 / 100))
    assert new_state == zero_state
    ppo_out, _ = AdaptiveKL(rule="ppo", target=1.0).update(state, ControlInput(kl=-0.3, batch_size=1))
    assert ppo_out.reason == "lowered beta 0.1 -> 0.05: KL 0 < target/1.5 = 0.6667; halve"


def test_name_and_acts_while_warming():
    assert AdaptiveKL.name == "adaptive_kl"
    assert AdaptiveKL.acts_while_warming is True
    assert AdaptiveKL(beta_ceil=0.5).beta_ceil == 0.5


def test_bad_state_and_payload():
    ctl = AdaptiveKL()
    with pytest.raises(LoopguardTypeError, match=re.escape("`state` must be an AdaptiveKLState")):
        ctl.update(BangBang().init(0.1), ControlInput(kl=1.0, batch_size=1))
    with pytest.raises(ConfigError, match=re.escape("`state.beta` must be in this controller's")):
        ctl.update(AdaptiveKLState(step=0, base_beta=0.1, beta=3.0), ControlInput(kl=1.0, batch_size=1))
    payload = ctl.init(0.1).to_dict()
    payload["beta"] = 0
    with pytest.raises(ConfigError, match=re.escape("`state.beta` must be > 0, got 0.")):
        AdaptiveKLState.from_dict(payload)
    with pytest.raises(
        StateError, match=re.escape("`state` must be a dict (from AdaptiveKLState.to_dict())")
    ):
        AdaptiveKLState.from_dict("state")
