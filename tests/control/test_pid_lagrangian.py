import itertools
import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, InputError, LoopguardTypeError, StateError
from loopguard.control import BangBang, ControlInput, PIDLagrangian, PIDLagrangianState

# --------------------------------------------------------------------------------------------------
# an independent, naive reference (full lists and explicit indices instead of a rolling window)


def reference_pid(scores, base, *, limit, kp, ki, kd, ema_p, ema_d, delay, imax, floor, ceil):
    integral, p_ema, emas, betas, integrals = 0.0, 0.0, [], [], []
    for k, score in enumerate(scores):
        delta = score - limit
        integral = min(imax, max(0.0, integral + ki * delta))
        p_ema = ema_p * p_ema + (1 - ema_p) * delta
        emas.append(score if k == 0 else ema_d * emas[-1] + (1 - ema_d) * score)
        derivative = max(0.0, emas[k] - emas[max(0, k - delay)])
        lam = max(0.0, kp * p_ema + integral + kd * derivative)
        betas.append(min(ceil, max(floor, base + lam)))
        integrals.append(integral)
    return betas, integrals


def run(controller, scores, base, allow=None):
    state = controller.init(base)
    outputs, states = [], []
    for k, score in enumerate(scores):
        output, state = controller.update(
            state, ControlInput(vote=score), allow_lower=True if allow is None else allow[k]
        )
        outputs.append(output)
        states.append(state)
    return outputs, states


def test_hand_computed_first_steps():
    # base 0.04, defaults (limit 0.15, kp 0.1, ki 0.01, kd 0.1, alphas 0.95):
    # step 1: score 0.05 -> error -0.10, I 0, P -0.005, J_ema 0.05 (first value), D 0, lambda 0 -> 0.04
    # step 2: score 0.80 -> error 0.65, I 0.0065, P 0.95*-0.005 + 0.05*0.65 = 0.02775 (kp P = 0.002775),
    #         J_ema 0.95*0.05 + 0.05*0.8 = 0.0875, D 0.0875 - 0.05 = 0.0375 (kd D = 0.00375)
    #         -> lambda 0.013025 -> 0.053025
    # step 3: I 0.013, P 0.95*0.02775 + 0.0325 = 0.0588625, J_ema 0.123125, D 0.073125
    #         -> lambda 0.00588625 + 0.013 + 0.0073125 = 0.02619875 -> 0.06619875
    outputs, states = run(PIDLagrangian(), [0.05, 0.8, 0.8], 0.04)
    assert [o.beta for o in outputs] == pytest.approx([0.04, 0.053025, 0.06619875], rel=1e-12)
    assert [o.direction for o in outputs] == ["hold", "raise", "raise"]
    assert outputs[1].components == pytest.approx(
        {
            "score": 0.8,
            "limit": 0.15,
            "error": 0.65,
            "p": 0.002775,
            "i": 0.0065,
            "d": 0.00375,
            "lambda": 0.013025,
            "base_beta": 0.04,
        }
    )
    assert states[2].j_history == pytest.approx((0.05, 0.0875, 0.123125))


def test_reason_carries_the_numbers():
    outputs, _ = run(PIDLagrangian(kp=1.0, ki=0.1, kd=1.0), [0.05, 0.8], 0.04)
    assert outputs[0].reason == (
        "held beta 0.04 (the starting beta): score 0.05 vs limit 0.15 (error -0.10); "
        "lambda 0 = P -0.005 + I 0 + D 0"
    )
    assert outputs[1].reason == (
        "raised beta 0.04 -> 0.1703: score 0.80 vs limit 0.15 (error +0.65); "
        "lambda 0.1303 = P 0.02775 + I 0.065 + D 0.0375"
    )


@st.composite
def configs(draw):
    floor = draw(st.floats(1e-6, 0.05))
    ceil = draw(st.floats(floor * 1.01, 2.0))
    gains = draw(st.tuples(st.floats(0, 3), st.floats(0, 1), st.floats(0, 3)).filter(lambda g: sum(g) > 0))
    ctl = PIDLagrangian(
        limit=draw(st.floats(0.01, 0.99)),
        kp=gains[0],
        ki=gains[1],
        kd=gains[2],
        ema_p=draw(st.floats(0.0, 0.99)),
        ema_d=draw(st.floats(0.0, 0.99)),
        d_delay=draw(st.integers(1, 15)),
        integral_max=draw(st.one_of(st.none(), st.floats(0.01, 3.0))),
        beta_floor=floor,
        beta_ceil=ceil,
    )
    return ctl, draw(st.floats(floor, ceil))


scores_st = st.lists(st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0])), max_size=60)


@settings(max_examples=50, deadline=None)
@given(configs(), scores_st)
def test_matches_naive_reference_and_invariants_hold(config, scores):
    ctl, base = config
    imax = ctl.integral_max if ctl.integral_max is not None else ctl.beta_ceil - base
    expected, integrals = reference_pid(
        scores,
        base,
        limit=ctl.limit,
        kp=ctl.kp,
        ki=ctl.ki,
        kd=ctl.kd,
        ema_p=ctl.ema_p,
        ema_d=ctl.ema_d,
        delay=ctl.d_delay,
        imax=imax,
        floor=ctl.beta_floor,
        ceil=ctl.beta_ceil,
    )
    outputs, states = run(ctl, scores, base)
    assert [o.beta for o in outputs] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert [s.integral for s in states] == pytest.approx(integrals, rel=1e-9, abs=1e-12)
    previous = base
    for output, state in zip(outputs, states, strict=True):
        assert 0 < ctl.beta_floor <= output.beta <= ctl.beta_ceil
        assert 0.0 <= state.integral <= max(imax, 0.0)  # projected >= 0 and anti-windup clamped
        assert output.components["lambda"] >= 0.0
        assert output.components["d"] >= 0.0
        assert len(state.j_history) <= ctl.d_delay
        assert output.direction == (
            "raise" if output.beta > previous else "lower" if output.beta < previous else "hold"
        )
        previous = output.beta


@settings(max_examples=50, deadline=None)
@given(configs(), st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans()), max_size=60))
def test_allow_lower_false_never_lowers(config, steps):
    ctl, base = config
    outputs, _ = run(ctl, [s for s, _ in steps], base, [a for _, a in steps])
    for output, (_, allowed) in zip(outputs, steps, strict=True):
        if not allowed:
            assert output.direction != "lower"


@settings(max_examples=50, deadline=None)
@given(configs(), st.floats(0.0, 1.0), st.integers(1, 40))
def test_constant_score_at_or_below_limit_keeps_the_users_beta(config, fraction, steps):
    ctl, base = config
    score = ctl.limit * fraction
    outputs, states = run(ctl, [score] * steps, base)
    assert all(o.beta == base and o.direction == "hold" for o in outputs)
    assert all(s.integral == 0.0 for s in states)


@settings(max_examples=50, deadline=None)
@given(configs(), st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40))
def test_derivative_is_one_sided(config, scores):
    ctl, base = config
    falling = sorted(scores, reverse=True)
    outputs, _ = run(ctl, falling, base)
    assert all(o.components["d"] == 0.0 for o in outputs)


def test_derivative_of_a_falling_score_stays_zero_through_float_round_off():
    # Found by hypothesis: with ema_d 0 the step 1.0 + (1e-119 - 1.0) rounds to 0.0, below the score, and the
    # next, smaller score then looked like a rise (D = 1e-243 > 0).
    ctl = PIDLagrangian(limit=0.5, kp=0.0, ki=0.0, kd=1.0, ema_p=0.0, ema_d=0.0, d_delay=1, beta_floor=0.03)
    outputs, states = run(ctl, [1.0, 4.64895863303578e-119, 9.939636403338296e-244], 1.0)
    assert [o.components["d"] for o in outputs] == [0.0, 0.0, 0.0]
    assert [s.j_ema for s in states] == [1.0, 4.64895863303578e-119, 9.939636403338296e-244]


@settings(max_examples=50, deadline=None)
@given(configs(), scores_st, st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30))
def test_json_round_trip_mid_sequence_gives_identical_future(config, before, after):
    ctl, base = config
    state = ctl.init(base)
    for score in before:
        _, state = ctl.update(state, ControlInput(vote=score))
    restored = PIDLagrangianState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    for score in after:
        out_a, state = ctl.update(state, ControlInput(vote=score))
        out_b, restored = ctl.update(restored, ControlInput(vote=score))
        assert out_a == out_b
        assert state == restored


def test_integral_does_not_wind_negative_during_healthy_steps():
    # The predecessor's integral went negative over a long healthy stretch, so the first real hack got a weak
    # response. Projected to >= 0, 100 healthy steps change nothing.
    ctl = PIDLagrangian()
    fresh, _ = run(ctl, [0.9, 0.9], 0.04)
    after_healthy, states = run(ctl, [0.0] * 100 + [0.9, 0.9], 0.04)
    assert min(s.integral for s in states) == 0.0
    assert after_healthy[-1].components["i"] == fresh[-1].components["i"]


def test_integral_is_clamped_at_the_anti_windup_limit():
    ctl = PIDLagrangian(beta_ceil=0.5)
    outputs, states = run(ctl, [1.0] * 200, 0.04)
    assert max(s.integral for s in states) == pytest.approx(0.5 - 0.04)
    assert outputs[-1].beta == 0.5
    assert outputs[-1].reason.startswith("held beta at the ceiling 0.5: score 1.00")
    outputs, states = run(PIDLagrangian(integral_max=0.1), [1.0] * 50, 0.04)
    assert max(s.integral for s in states) == pytest.approx(0.1)


def test_default_gains_respond_within_a_few_steps_and_return_to_base():
    ctl = PIDLagrangian()
    for base in (0.001, 0.04, 0.3):
        outputs, _ = run(ctl, [0.05] * 5 + [0.8] * 3, base)
        # after 5 healthy steps, the first hacking step adds P 0.0011 + I 0.0065 + D 0.00375 = 0.0114 and the
        # third 0.0073 + 0.0195 + 0.0107 = 0.0375 (11x and 38x a base of 0.001; the Goodhart benchmark showed
        # that 10x larger gains drive beta to the ceiling within a few steps and freeze learning)
        assert base + 0.0113 < outputs[5].beta < base + 0.0115
        assert base + 0.037 < outputs[7].beta < base + 0.038
    outputs, _ = run(ctl, [0.8] * 10 + [0.0] * 100, 0.04)
    betas = [o.beta for o in outputs]
    back = betas.index(0.04, 10)
    # 10 hacking steps wind the integral to 10 * 0.01 * 0.65 = 0.065; a score of 0 unwinds it by 0.01 * 0.15
    # per step, so the integral alone needs 44 steps; the negative P term brings beta back to base sooner.
    assert back < 10 + 44
    assert all(b == 0.04 for b in betas[back:])
    assert all(later <= earlier for earlier, later in itertools.pairwise(betas[10:]))


def test_allow_lower_false_reason():
    ctl = PIDLagrangian()
    state = ctl.init(0.04)
    for score in [0.9, 0.9]:
        _, state = ctl.update(state, ControlInput(vote=score))
    output, _ = ctl.update(state, ControlInput(vote=0.0), allow_lower=False)
    assert output.direction == "hold"
    assert output.beta == state.beta
    assert output.reason.startswith(f"held beta {state.beta:.4g}: the controller would lower it to ")
    assert "lowering is not allowed now (cooldown after a rollback)" in output.reason


# --------------------------------------------------------------------------------------------------
# simulated plant


@pytest.mark.parametrize("base_beta", [0.001, 0.04, 0.3])
def test_plant_with_persistent_hack_pressure_is_held_below_the_trip_band(plant, base_beta):
    for seed in range(3):
        scores, betas = plant(PIDLagrangian(), base_beta, seed=seed)
        assert scores[-200:].max() < 0.3
        assert betas.min() == base_beta
        assert betas.max() <= 1.0
        # the pressure needs beta above base for good: the integral holds it there
        assert np.mean(betas[-200:]) > base_beta


@pytest.mark.parametrize("base_beta", [0.001, 0.04, 0.3])
def test_plant_hack_episode_ends_with_beta_back_at_base(plant, base_beta):
    for seed in range(3):
        scores, betas = plant(PIDLagrangian(), base_beta, seed=seed, drift_until=200)
        assert betas[:200].max() > base_beta
        assert scores[-150:].max() < 0.3
        assert betas[-1] == base_beta


def test_plant_log_response_sanity(plant):
    # Without control (beta fixed at base) the same plant drifts far above the trip band.
    class Fixed:
        def init(self, base):
            return base

        def update(self, state, signal):
            return SimpleNamespace(beta=state), state

    scores, _ = plant(Fixed(), 0.04)
    assert scores[-100:].min() > 0.9
    assert math.isclose(scores[0], 0.05)


# --------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"limit": 0.0}, ConfigError, "`limit` must be in (0, 1), got 0.0."),
        ({"limit": 1.0}, ConfigError, "`limit` must be in (0, 1), got 1.0."),
        ({"limit": True}, LoopguardTypeError, "`limit` must be a real number (not bool), got True."),
        ({"kp": -1.0}, ConfigError, "`kp` must be >= 0, got -1.0."),
        ({"ki": float("nan")}, ConfigError, "`ki` must be finite, got nan."),
        ({"kp": 0, "ki": 0, "kd": 0}, ConfigError, "`kp`, `ki` and `kd` must not all be 0, got 0, 0, 0"),
        ({"ema_p": 1.0}, ConfigError, "`ema_p` must be in [0, 1), got 1.0."),
        ({"ema_d": -0.1}, ConfigError, "`ema_d` must be in [0, 1), got -0.1."),
        ({"d_delay": 0}, ConfigError, "`d_delay` must be in [1, 10000], got 0."),
        ({"d_delay": 10_001}, ConfigError, "`d_delay` must be in [1, 10000], got 10001."),
        ({"d_delay": 10.0}, LoopguardTypeError, "`d_delay` must be an integer, got 10.0 of type float."),
        ({"integral_max": 0.0}, ConfigError, "`integral_max` must be > 0, got 0.0."),
        (
            {"beta_floor": 0.5, "beta_ceil": 0.1},
            ConfigError,
            "`beta_ceil` must be > beta_floor (0.5), got 0.1.",
        ),
    ],
)
def test_bad_config(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        PIDLagrangian(**kwargs)


@pytest.mark.parametrize(
    ("score", "error", "message"),
    [
        (1.2, InputError, "`vote` must be in [0, 1], got 1.2."),
        (float("-inf"), InputError, "`vote` must be finite, got -inf."),
        (False, LoopguardTypeError, "`vote` must be a real number (not bool), got False."),
    ],
)
def test_bad_score(score, error, message):
    # The score reaches the controller as ControlInput.vote, checked when the input is built.
    with pytest.raises(error, match=re.escape(message)):
        ControlInput(vote=score)


def test_update_needs_a_control_input():
    ctl = PIDLagrangian()
    with pytest.raises(
        LoopguardTypeError,
        match=re.escape(
            "`signal` must be a ControlInput (e.g. ControlInput(vote=0.4)), got 0.5 of type float."
        ),
    ):
        ctl.update(ctl.init(0.04), 0.5)


def test_bad_base_beta_and_state():
    with pytest.raises(
        ConfigError, match=re.escape("`base_beta` must be in [beta_floor, beta_ceil] = [0.01, 1]")
    ):
        PIDLagrangian(beta_floor=0.01).init(0.001)
    ctl = PIDLagrangian()
    with pytest.raises(LoopguardTypeError, match=re.escape("`state` must be a PIDLagrangianState")):
        ctl.update(BangBang().init(0.04), ControlInput(vote=0.5))
    long_state = PIDLagrangian(d_delay=20).init(0.04)
    for _ in range(15):
        _, long_state = PIDLagrangian(d_delay=20).update(long_state, ControlInput(vote=0.5))
    with pytest.raises(
        ConfigError, match=re.escape("`state.j_history` must have at most d_delay (10) items, got 15")
    ):
        ctl.update(long_state, ControlInput(vote=0.5))


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (lambda d: d.update(integral=-0.1), ConfigError, "`state.integral` must be >= 0, got -0.1."),
        (
            lambda d: d.update(j_history=[2.0]),
            ConfigError,
            "`state.j_history[0]` must be in [0, 1], got 2.0.",
        ),
        (
            lambda d: d.update(j_history="0.5"),
            StateError,
            "`state.j_history` must be a list of numbers",
        ),
        (
            lambda d: d.update(j_history=[0.1] * 10_001),
            ConfigError,
            "must have at most 10,000 items, got 10,001.",
        ),
        (lambda d: d.update(p_ema=1.5), ConfigError, "`state.p_ema` must be in [-1, 1], got 1.5."),
        (
            lambda d: d.update(kind="BangBangState"),
            ConfigError,
            "`state['kind']` must be 'PIDLagrangianState'",
        ),
    ],
)
def test_from_dict_validates(mutate, error, message):
    payload = PIDLagrangian().init(0.04).to_dict()
    mutate(payload)
    with pytest.raises(error, match=re.escape(message)):
        PIDLagrangianState.from_dict(payload)
