import json
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, InputError, LoopguardTypeError, StateError
from loopguard.control import BangBang, BangBangState, ControlInput, ControlOutput, PIDLagrangian
from loopguard.log import redact_secrets

# --------------------------------------------------------------------------------------------------
# an independent, naive reference


def reference_betas(
    votes,
    base,
    *,
    trip=0.3,
    release=0.1,
    dwell=2,
    patience=3,
    gain=1.5,
    ceil=1.0,
    allow=None,
    dead_time=False,
):
    """Bang-bang written from the spec as plainly as possible (``dead_time``: no raise right after a raise).

    A trip raises on every high vote until its first relaxing step (blocked or not); from then on, as before
    the trip, a raise needs ``dwell`` high votes in a row.
    """
    beta, tripped, high_run, low_run, out, raised = base, False, 0, 0, [], -2
    raising = False
    for k, vote in enumerate(votes):
        allow_lower = True if allow is None else allow[k]
        high_run = high_run + 1 if vote >= trip else 0
        low_run = low_run + 1 if vote <= release else 0
        if vote >= trip and (raising or high_run >= dwell):
            if not (dead_time and tripped and raised == k - 1 and beta < ceil):
                tripped, raised, raising = True, k, True
                beta = min(ceil, beta * gain)
        elif vote <= release and tripped and low_run >= patience:
            raising = False
            if allow_lower:
                beta = beta / gain
                if beta <= base * (1 + 1e-9):
                    beta, tripped = base, False
        out.append(beta)
    return out


def run(controller, votes, base, allow=None):
    state = controller.init(base)
    outputs, states = [], []
    for k, vote in enumerate(votes):
        output, state = controller.update(
            state, ControlInput(vote=vote), allow_lower=True if allow is None else allow[k]
        )
        outputs.append(output)
        states.append(state)
    return outputs, states


# The worked example of docs/controllers.md: (vote, beta after, direction), base beta 0.01, default config.
WORKED = [
    (0.05, 0.01, "hold"),
    (0.35, 0.01, "hold"),  # 1 of 2 dwell steps
    (0.20, 0.01, "hold"),  # inside the band: the high streak is broken
    (0.40, 0.01, "hold"),  # 1 of 2 again
    (0.45, 0.015, "raise"),  # tripped
    (0.50, 0.0225, "raise"),
    (0.25, 0.0225, "hold"),  # inside the band: hold
    (0.08, 0.0225, "hold"),  # 1 of 3 patience
    (0.06, 0.0225, "hold"),  # 2 of 3
    (0.09, 0.015, "lower"),
    (0.15, 0.015, "hold"),  # inside the band: relaxing pauses, the low streak is broken
    (0.03, 0.015, "hold"),
    (0.02, 0.015, "hold"),
    (0.01, 0.01, "lower"),  # back at the user's beta: released
    (0.02, 0.01, "hold"),
]


def test_worked_example_hand_computed():
    votes = [vote for vote, _, _ in WORKED]
    outputs, states = run(BangBang(memory_half_life=0, hold_receding=False), votes, 0.01)
    assert [o.beta for o in outputs] == pytest.approx([beta for _, beta, _ in WORKED], rel=1e-12)
    assert [o.direction for o in outputs] == [direction for _, _, direction in WORKED]
    assert [s.tripped for s in states] == [False] * 4 + [True] * 9 + [False] * 2
    assert outputs[-2].beta == 0.01  # exactly the user's beta, not a float hair above or below
    assert outputs[-1].components["tripped"] == 0.0
    assert [s.step for s in states] == list(range(1, 16))


def test_reasons_carry_the_numbers():
    outputs, _ = run(BangBang(memory_half_life=0, hold_receding=False), [x for x, _, _ in WORKED], 0.01)
    assert outputs[1].reason == "held beta 0.01: vote 0.35 >= trip 0.3 for 1 of 2 steps needed to trip"
    assert outputs[2].reason == "held beta 0.01: vote 0.20 inside the hysteresis band (0.1, 0.3)"
    assert outputs[4].reason == "raised beta 0.01 -> 0.015: vote 0.45 >= trip 0.3 for 2 steps"
    assert outputs[7].reason == "held beta 0.0225: vote 0.08 <= release 0.1 for 1 of 3 steps needed to relax"
    assert outputs[9].reason == "lowered beta 0.0225 -> 0.015: vote 0.09 <= release 0.1 for 3 steps"
    assert outputs[13].reason == (
        "lowered beta 0.015 -> 0.01: vote 0.01 <= release 0.1 for 3 steps; back at the starting beta, released"
    )
    assert outputs[14].reason == "held beta 0.01 (the starting beta): vote 0.02 <= release 0.1"


def test_components_explain_the_step():
    outputs, _ = run(BangBang(memory_half_life=0), [0.5, 0.71], 0.01)
    assert isinstance(outputs[1], ControlOutput)
    assert outputs[1].components == {
        "vote": 0.71,
        "trip_band": 0.3,
        "release_band": 0.1,
        "steps_above": 2.0,
        "steps_below": 0.0,
        "gain": 1.5,
        "base_beta": 0.01,
        "tripped": 1.0,
        "lower_blocked": 0.0,
        "floor_beta": 0.01,
        "held_receding": 0.0,
        "held_dwell": 0.0,
    }


def test_raise_stops_at_the_ceiling_and_says_so():
    ctl = BangBang(beta_ceil=0.02, hold_receding=False)
    outputs, _ = run(ctl, [0.9, 0.9, 0.9, 0.9], 0.01)
    assert [o.beta for o in outputs] == pytest.approx([0.01, 0.015, 0.02, 0.02])
    assert outputs[2].reason.endswith("(now at the ceiling)")
    assert outputs[3].direction == "hold"
    assert outputs[3].reason == "held beta at the ceiling 0.02: vote 0.90 >= trip 0.3 for 4 steps"


def test_release_returns_to_the_users_beta_not_a_floor_below_it():
    # The predecessor relaxed to a floor (0.02) under the user's beta; after one trip and release the run was
    # regularised less than configured. Here beta comes back to exactly the base beta and stays.
    ctl = BangBang(beta_floor=0.001, memory_half_life=0)
    votes = [0.9] * 6 + [0.0] * 40
    outputs, states = run(ctl, votes, 0.05)
    assert max(o.beta for o in outputs) > 0.05
    assert outputs[-1].beta == 0.05
    assert min(o.beta for o in outputs) == 0.05
    assert not states[-1].tripped


def test_allow_lower_false_holds_and_counters_still_advance():
    ctl = BangBang(memory_half_life=0)
    votes = [0.9, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0]
    allow = [True, True, False, False, False, False, True]
    outputs, states = run(ctl, votes, 0.01, allow)
    assert [o.beta for o in outputs] == pytest.approx([0.01, 0.015, 0.015, 0.015, 0.015, 0.015, 0.01])
    assert outputs[4].components["lower_blocked"] == 1.0
    assert outputs[4].reason == (
        "held beta 0.015: vote 0.00 <= release 0.1 for 3 steps, but lowering is not allowed now "
        "(cooldown after a rollback)"
    )
    assert states[5].steps_below == 4
    assert outputs[6].direction == "lower"  # relaxes at once when allowed again


# --------------------------------------------------------------------------------------------------
# properties

votes_st = st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 0.1, 0.3, 0.2, 1.0]))
# Runs of one repeated vote, so that sequences reach trips, long raises and full releases, not only noise.
vote_runs_st = st.lists(st.tuples(votes_st, st.integers(1, 8)), max_size=12).map(
    lambda runs: [vote for vote, repeat in runs for _ in range(repeat)]
)


@st.composite
def configs(draw):
    trip = draw(st.floats(0.05, 1.0))
    release = draw(st.floats(0.0, trip * 0.95))
    floor = draw(st.floats(1e-6, 0.1))
    ceil = draw(st.floats(floor * 1.01, 2.0))
    base = draw(st.floats(floor, ceil))
    ctl = BangBang(
        trip_band=trip,
        release_band=release,
        dwell_steps=draw(st.integers(1, 4)),
        release_patience=draw(st.integers(1, 4)),
        gain=draw(st.floats(1.01, 5.0)),
        beta_floor=floor,
        beta_ceil=ceil,
        memory_half_life=0,
        hold_receding=draw(st.booleans()),
    )
    return ctl, base


@settings(max_examples=50, deadline=None)
@given(configs(), vote_runs_st, st.lists(st.booleans(), min_size=100, max_size=100))
def test_beta_stays_in_base_ceil_and_matches_reference(config, votes, allow_flags):
    ctl, base = config
    allow = allow_flags[: len(votes)]
    outputs, states = run(ctl, votes, base, allow)
    expected = reference_betas(
        votes,
        base,
        trip=ctl.trip_band,
        release=ctl.release_band,
        dwell=ctl.dwell_steps,
        patience=ctl.release_patience,
        gain=ctl.gain,
        ceil=ctl.beta_ceil,
        allow=allow,
        dead_time=ctl.hold_receding,
    )
    assert [o.beta for o in outputs] == pytest.approx(expected, rel=1e-9)
    previous = base
    for output, state, allowed in zip(outputs, states, allow, strict=True):
        assert 0 < ctl.beta_floor <= base <= output.beta <= ctl.beta_ceil
        assert state.beta == output.beta
        assert state.tripped or output.beta == base
        assert output.direction == (
            "raise" if output.beta > previous else "lower" if output.beta < previous else "hold"
        )
        if not allowed:
            assert output.direction != "lower"
        previous = output.beta


@settings(max_examples=50, deadline=None)
@given(configs(), vote_runs_st, st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30))
def test_no_change_while_votes_stay_strictly_inside_the_band(config, prefix, raw_band_votes):
    # After ANY prefix of votes, a run of votes strictly inside (release_band, trip_band) leaves beta and the
    # tripped flag exactly as they were, and every step of the run reports "hold".
    ctl, base = config
    lo, hi = ctl.release_band, ctl.trip_band
    band_votes = [lo + (hi - lo) * (0.001 + 0.998 * u) for u in raw_band_votes]
    assert all(lo < v < hi for v in band_votes)
    state = ctl.init(base)
    for vote in prefix:
        _, state = ctl.update(state, ControlInput(vote=vote))
    beta, tripped = state.beta, state.tripped
    for vote in band_votes:
        output, state = ctl.update(state, ControlInput(vote=vote))
        assert output.direction == "hold"
        assert output.beta == beta
        assert state.tripped == tripped


@settings(max_examples=50, deadline=None)
@given(configs(), vote_runs_st, vote_runs_st)
def test_json_round_trip_mid_sequence_gives_identical_future(config, before, after):
    ctl, base = config
    state = ctl.init(base)
    for vote in before:
        _, state = ctl.update(state, ControlInput(vote=vote))
    restored = BangBangState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    for vote in after:
        out_a, state = ctl.update(state, ControlInput(vote=vote))
        out_b, restored = ctl.update(restored, ControlInput(vote=vote))
        assert out_a == out_b
        assert state == restored


# --------------------------------------------------------------------------------------------------
# simulated plant


@pytest.mark.parametrize("base_beta", [0.001, 0.04, 0.3])
def test_plant_with_persistent_hack_pressure_keeps_excursions_short_and_small(plant, base_beta):
    # With pressure that grows whenever beta is back at the user's value, a controller that returns to the
    # user's beta (by design) cannot hold the score under the trip band for good: it limit-cycles. What it
    # must do is cut every excursion short: never above trip + 0.1, never more than dwell + 3 steps above
    # trip, and above trip on at most a fifth of the steps.
    for seed in range(3):
        scores, betas = plant(BangBang(memory_half_life=0, hold_receding=False), base_beta, seed=seed)
        first = int(np.argmax(scores >= 0.3))
        assert first > 0
        after = scores[first:]
        assert after.max() < 0.4
        longest = run_length = 0
        for high in after >= 0.3:
            run_length = run_length + 1 if high else 0
            longest = max(longest, run_length)
        assert longest <= 2 + 3
        assert np.mean(scores[-200:] >= 0.3) < 0.2
        assert betas.min() == base_beta
        assert betas.max() <= 1.0


@pytest.mark.parametrize("base_beta", [0.001, 0.04, 0.3])
def test_plant_hack_episode_is_brought_under_the_band_and_beta_returns_to_base(plant, base_beta):
    for seed in range(3):
        scores, betas = plant(BangBang(memory_half_life=0), base_beta, seed=seed, drift_until=200)
        assert scores[:200].max() >= 0.3  # the hack did trip the controller
        assert betas[:200].max() > base_beta
        assert scores[-150:].max() < 0.3
        assert betas[-1] == base_beta
        assert betas.min() == base_beta


# --------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"trip_band": True}, LoopguardTypeError, "`trip_band` must be a real number (not bool), got True."),
        ({"trip_band": float("nan")}, ConfigError, "`trip_band` must be finite, got nan."),
        ({"trip_band": 0.0}, ConfigError, "`trip_band` must be in (0, 1], got 0.0."),
        ({"release_band": 0.3}, ConfigError, "`release_band` must be < trip_band (0.3), got 0.3."),
        ({"release_band": -0.1}, ConfigError, "`release_band` must be in [0, 1], got -0.1."),
        ({"dwell_steps": 0}, ConfigError, "`dwell_steps` must be >= 1, got 0."),
        (
            {"dwell_steps": 2.0},
            LoopguardTypeError,
            "`dwell_steps` must be an integer, got 2.0 of type float.",
        ),
        ({"release_patience": 0}, ConfigError, "`release_patience` must be >= 1, got 0."),
        ({"gain": 1.0}, ConfigError, "`gain` must be > 1, got 1.0."),
        ({"gain": "2"}, LoopguardTypeError, "`gain` must be a real number, got '2' of type str."),
        ({"beta_floor": 0.0}, ConfigError, "`beta_floor` must be > 0, got 0.0."),
        ({"beta_floor": 1.0}, ConfigError, "`beta_ceil` must be > beta_floor (1), got 1.0."),
        ({"beta_ceil": float("inf")}, ConfigError, "`beta_ceil` must be finite, got inf."),
    ],
)
def test_bad_config(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        BangBang(**kwargs)


@pytest.mark.parametrize(
    ("base", "error", "message"),
    [
        (2.0, ConfigError, "`base_beta` must be in [beta_floor, beta_ceil] = [1e-06, 1], got 2.0."),
        (1e-7, ConfigError, "`base_beta` must be in [beta_floor, beta_ceil] = [1e-06, 1], got 1e-07."),
        (0.0, ConfigError, "`base_beta` must be > 0, got 0.0."),
        (float("nan"), ConfigError, "`base_beta` must be finite, got nan."),
        (True, LoopguardTypeError, "`base_beta` must be a real number (not bool), got True."),
        (None, LoopguardTypeError, "`base_beta` must be a real number, got None of type NoneType."),
    ],
)
def test_bad_base_beta(base, error, message):
    with pytest.raises(error, match=re.escape(message)):
        BangBang(memory_half_life=0).init(base)


@pytest.mark.parametrize(
    ("vote", "error", "message"),
    [
        (1.5, InputError, "`vote` must be in [0, 1], got 1.5."),
        (-0.01, InputError, "`vote` must be in [0, 1], got -0.01."),
        (float("nan"), InputError, "`vote` must be finite, got nan."),
        (True, LoopguardTypeError, "`vote` must be a real number (not bool), got True."),
        ("0.5", LoopguardTypeError, "`vote` must be a real number, got '0.5' of type str."),
    ],
)
def test_bad_vote_is_refused_when_the_input_is_built(vote, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ControlInput(vote=vote)


@pytest.mark.parametrize(
    ("signal", "allow_lower", "message"),
    [
        (ControlInput(vote=0.5), 1, "`allow_lower` must be a bool, got 1 of type int."),
        (0.5, True, "`signal` must be a ControlInput (e.g. ControlInput(vote=0.4)), got 0.5 of type float."),
        (
            None,
            True,
            "`signal` must be a ControlInput (e.g. ControlInput(vote=0.4)), got None of type NoneType.",
        ),
    ],
)
def test_bad_update_arguments(signal, allow_lower, message):
    ctl = BangBang(memory_half_life=0)
    with pytest.raises(LoopguardTypeError, match=re.escape(message)):
        ctl.update(ctl.init(0.01), signal, allow_lower=allow_lower)


def test_numpy_scalars_are_accepted():
    ctl = BangBang(memory_half_life=0)
    output, _ = ctl.update(ctl.init(np.float32(0.01)), ControlInput(vote=np.float64(0.5)))
    assert type(output.beta) is float
    assert type(output.components["vote"]) is float


def test_wrong_state_is_rejected():
    ctl = BangBang(memory_half_life=0)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`state` must be a BangBangState (from BangBang.init")
    ):
        ctl.update(PIDLagrangian().init(0.01), ControlInput(vote=0.5))
    with pytest.raises(LoopguardTypeError, match=re.escape("`state` must be a BangBangState")):
        ctl.update(ctl.init(0.01).to_dict(), ControlInput(vote=0.5))
    other = BangBang(beta_ceil=5.0).init(3.0)
    with pytest.raises(
        ConfigError, match=re.escape("`state.base_beta` must be in this controller's [beta_floor")
    ):
        ctl.update(other, ControlInput(vote=0.5))


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (lambda d: d.pop("beta"), ConfigError, "got missing ['beta'], unexpected []."),
        (lambda d: d.update(extra=1), ConfigError, "got missing [], unexpected ['extra']."),
        (lambda d: d.update(kind="LadderState"), ConfigError, "`state['kind']` must be 'BangBangState', got"),
        (lambda d: d.update(version=2), ConfigError, "`state['version']` must be 1, got 2."),
        (lambda d: d.update(beta="0.1"), StateError, "`state.beta` must be a real number, got '0.1'"),
        (lambda d: d.update(beta=-1.0), ConfigError, "`state.beta` must be > 0, got -1.0."),
        (
            lambda d: d.update(tripped=1),
            StateError,
            "`state.tripped` must be a bool, got 1 of type int.",
        ),
        (lambda d: d.update(step=1.5), StateError, "`state.step` must be an integer, got 1.5"),
        (lambda d: d.update(beta=0.001), ConfigError, "`beta` must be >= base_beta (0.01), got 0.001."),
        (
            lambda d: d.update(beta=0.02),
            ConfigError,
            "`beta` must be base_beta (0.01) when untripped, got 0.02.",
        ),
        (lambda d: d.update(steps_above=1, steps_below=1), ConfigError, "cannot both be > 0, got 1 and 1."),
        (
            lambda d: d.update(raise_kl=0.3),
            ConfigError,
            "`raise_kl` and `raise_step` must be None when untripped, got 0.3 and None.",
        ),
        (
            lambda d: d.update(tripped=True, beta=0.02, raise_step=3),
            ConfigError,
            "`raise_step` must be <= step (0), got 3.",
        ),
        (lambda d: d.update(raise_kl=float("inf")), StateError, "`state.raise_kl` must be finite, got inf."),
    ],
)
def test_from_dict_validates(mutate, error, message):
    payload = BangBang(memory_half_life=0).init(0.01).to_dict()
    mutate(payload)
    with pytest.raises(error, match=re.escape(message)):
        BangBangState.from_dict(payload)


def test_from_dict_rejects_non_dict():
    with pytest.raises(StateError, match=re.escape("`state` must be a dict (from BangBangState.to_dict())")):
        BangBangState.from_dict([1, 2])


def test_to_dict_is_plain_json():
    _, states = run(BangBang(memory_half_life=0), [0.9, 0.9], 0.01)
    payload = states[-1].to_dict()
    assert payload == {
        "kind": "BangBangState",
        "version": 1,
        "step": 2,
        "base_beta": 0.01,
        "beta": pytest.approx(0.015),
        "tripped": True,
        "steps_above": 2,
        "steps_below": 0,
        "floor_beta": None,
        "raise_kl": None,
        "raise_step": 2,
        "remember": True,
    }
    assert json.loads(json.dumps(payload)) == payload


def test_a_state_saved_before_the_memory_existed_loads_without_a_floor():
    payload = BangBang().init(0.01).to_dict()
    del payload["floor_beta"], payload["raise_kl"], payload["raise_step"], payload["remember"]
    loaded = BangBangState.from_dict(payload)
    assert loaded.floor_beta is None
    assert loaded.remember


def test_a_floor_cannot_be_kept_by_a_state_that_forgot():
    with pytest.raises(ConfigError, match=re.escape("`floor_beta` must be None when remember is False, got 0.05.")):
        BangBangState(step=3, base_beta=0.01, beta=0.08, tripped=True, steps_above=0, steps_below=1,
                      floor_beta=0.05, remember=False)  # fmt: skip


# ---------------------------------------------------------------------------------- memory and sizing


def test_memory_holds_the_beta_that_held_the_hack_off_and_decays_by_half_per_half_life():
    ctl = BangBang(gain=2.0, release_patience=2, memory_half_life=10, hold_receding=False)
    votes = [0.9, 0.9, 0.9, 0.9] + [0.0] * 32  # trips at 0.01 -> 0.02 -> 0.04 -> 0.08, then healthy
    outputs, states = run(ctl, votes, 0.01)
    assert outputs[3].beta == pytest.approx(0.08)
    assert outputs[5].beta == pytest.approx(0.08)  # first relaxing step: 0.08 held the hack off
    assert states[5].floor_beta == pytest.approx(0.08)
    # ten healthy steps later the floor is halfway back to the user's beta: 0.01 + 0.07 / 2
    assert states[15].floor_beta == pytest.approx(0.01 + 0.07 / 2)
    assert outputs[15].beta == pytest.approx(0.01 + 0.07 / 2)
    assert "remembered beta" in outputs[15].reason
    classic, _ = run(BangBang(gain=2.0, release_patience=2, memory_half_life=0), votes, 0.01)
    assert classic[8].beta == pytest.approx(0.01)  # without memory: back at the user's beta by the gain


def test_a_trip_held_off_only_at_the_ceiling_remembers_at_most_the_sized_beta():
    """The ceiling is the controller's bound, not the beta that held: the floor is capped at the run's sized beta."""
    ctl = BangBang(gain=2.0, release_patience=2, memory_half_life=10, hold_receding=False)

    def trip_to_the_ceiling(healthy_kl):
        state, outputs = ctl.init(0.01), []
        hacking = ControlInput(vote=0.9, kl=2.0, advantage_scale=1.0)
        for signal in [hacking] * 4 + [ControlInput(vote=0.0, kl=healthy_kl, advantage_scale=1.0)] * 2:
            out, state = ctl.update(state, signal)
            outputs.append(out)
        return outputs, state

    outputs, state = trip_to_the_ceiling(0.5)
    # the trip: sized 0.5 / sqrt(2 * 2) = 0.25, then gain steps 0.5 and 1.0 (the ceiling)
    assert [o.beta for o in outputs[:4]] == pytest.approx([0.01, 0.25, 0.5, 1.0])
    # held off at the ceiling; at the healthy KL 0.5 the sized beta is 0.5 / sqrt(2 * 0.5) = 0.5
    assert state.floor_beta == pytest.approx(0.5)
    assert outputs[5].beta == pytest.approx(0.5)
    assert outputs[5].reason == (
        "lowered beta 1 -> 0.5: vote 0.00 <= release 0.1 for 2 steps; the ceiling 1 held the hack off, and the "
        "remembered beta is at most the one sized to the run, 0.5 (sized so that the KL pull beta*sqrt(2*KL) "
        "is 0.5 x the advantage scale 1 at the measured KL 0.5 nats/token); it halves its distance to the "
        "starting beta 0.01 every 10 healthy steps"
    )
    # a healthy KL that sizes to the ceiling, or no KL at all: the ceiling stays the floor
    assert trip_to_the_ceiling(0.01)[1].floor_beta == 1.0
    state = ctl.init(0.01)
    for signal in [ControlInput(vote=0.9, kl=2.0, advantage_scale=1.0)] * 4 + [ControlInput(vote=0.0)] * 2:
        _, state = ctl.update(state, signal)
    assert state.floor_beta == 1.0
    # a trip held off below the ceiling keeps its beta, whatever the KL sizes to
    state = ctl.init(0.01)
    for signal in [ControlInput(vote=0.9, kl=2.0, advantage_scale=1.0)] * 3 + [ControlInput(vote=0.0, kl=8.0,
                   advantage_scale=1.0)] * 2:  # fmt: skip
        _, state = ctl.update(state, signal)
    assert state.floor_beta == pytest.approx(0.5)


def test_forget_drops_the_floor_and_the_trip_in_progress_and_a_later_trip_is_remembered():
    """A penalty switched on mid-trip (forget): the trip's beta, raised against the old pay and again while the
    hack lasts, relaxes by the gain; a hack back with the penalty in force trips again, and the beta that
    then holds it off is the floor."""
    ctl = BangBang(gain=2.0, release_patience=2, memory_half_life=10, hold_receding=False)
    state, betas, floors, remembers = ctl.init(0.01), [], [], []
    for index, vote in enumerate([0.9, 0.9, 0.9, 0.9] + [0.0] * 6 + [0.9, 0.9] + [0.0] * 4):
        if index == 3:  # the penalty goes on: 0.04 was raised against the flaw's old pay
            state = ctl.forget(state)
            assert state.floor_beta is None
            assert not state.remember
        out, state = ctl.update(state, ControlInput(vote=vote))
        betas.append(out.beta)
        floors.append(state.floor_beta)
        remembers.append(state.remember)
    # 0.01 -> 0.02 -> 0.04 -> 0.08 (the hack lasts a step into the penalty); two healthy steps, then it
    # relaxes by the gain, with no floor, to the user's beta
    assert betas[:10] == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.08, 0.04, 0.02, 0.01, 0.01, 0.01])
    assert floors[:10] == [None] * 10
    assert remembers[3:6] == [False, False, True]  # until the trip's first relaxing step
    # tripped again with the penalty in force: 0.01 -> 0.02 held the hack off and is remembered
    assert betas[11] == pytest.approx(0.02)
    assert floors[13] == pytest.approx(0.02)
    assert betas[13:] == pytest.approx([0.02, 0.01 + 0.01 * 0.5**0.1, 0.01 + 0.01 * 0.5**0.2])


def test_forget_on_an_untripped_controller_leaves_its_next_trip_remembered():
    ctl = BangBang(gain=2.0, release_patience=2, memory_half_life=10, hold_receding=False)
    state = ctl.forget(ctl.init(0.01))  # the penalty went on before any trip: every trip is under it
    assert state.remember
    for vote in [0.9, 0.9, 0.9, 0.0, 0.0]:
        out, state = ctl.update(state, ControlInput(vote=vote))
    assert state.floor_beta == pytest.approx(0.04)
    assert out.beta == pytest.approx(0.04)


def test_memory_ends_the_limit_cycle_of_a_flaw_that_keeps_paying():
    """A plant whose hack returns whenever beta < 0.1: memory stays above it, no memory cycles."""

    def cycles(ctl):
        state, trips, beta = ctl.init(0.01), 0, 0.01
        for _ in range(300):
            vote = 0.9 if beta < 0.1 else 0.0
            out, new = ctl.update(state, ControlInput(vote=vote))
            trips += int(new.tripped and new.steps_above == 1 and not state.steps_above)
            state, beta = new, out.beta
        return trips

    assert cycles(BangBang(memory_half_life=0)) > 10
    assert cycles(BangBang(memory_half_life=200)) <= 3


def test_first_raise_is_sized_from_the_measured_kl_and_the_advantage_scale():
    ctl = BangBang(dwell_steps=1, hold_receding=False)
    out, state = ctl.update(ctl.init(0.001), ControlInput(vote=0.9, kl=2.0, advantage_scale=1.0))
    assert out.beta == pytest.approx(0.5 * 1.0 / math.sqrt(2 * 2.0))
    assert "sized so that the KL pull" in out.reason
    assert "2 nats/token" in out.reason
    out, _ = ctl.update(state, ControlInput(vote=0.9, kl=2.0, advantage_scale=1.0))
    assert out.beta == pytest.approx(0.25 * 1.5)  # later raises are gain steps
    # a tiny KL sizes to the ceiling; no KL or no scale: one gain step, as before
    assert ctl.update(ctl.init(0.001), ControlInput(vote=0.9, kl=0.0, advantage_scale=1.0))[0].beta == 1.0
    assert ctl.update(ctl.init(0.001), ControlInput(vote=0.9, kl=2.0))[0].beta == pytest.approx(0.0015)
    off = BangBang(dwell_steps=1, size_fraction=0)
    assert off.update(off.init(0.001), ControlInput(vote=0.9, kl=2.0, advantage_scale=1.0))[
        0
    ].beta == pytest.approx(0.0015)


# ------------------------------------------------------------------------- holding while the hack recedes


def test_a_raise_waits_one_step_for_its_effect():
    # The batch after a raise comes from a policy trained before it: raising again on it is blind.
    outputs, states = run(BangBang(memory_half_life=0), [0.9] * 6, 0.01)
    assert [o.beta for o in outputs] == pytest.approx([0.01, 0.015, 0.015, 0.0225, 0.0225, 0.03375])
    assert [o.components["held_receding"] for o in outputs] == [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert outputs[2].reason == (
        "held beta 0.015: vote 0.90 >= trip 0.3 for 3 steps, but beta was raised on the previous step and "
        "this step's batch comes from a policy trained before that raise: waiting one step to see its effect"
    )
    assert states[1].raise_step == 2
    assert states[3].raise_step == 4


def test_a_kl_falling_since_the_last_raise_holds_beta_and_a_rising_one_raises_it():
    ctl = BangBang(dwell_steps=1, memory_half_life=0)
    state = ctl.init(0.01)
    betas, reasons = [], []
    for kl in [0.5, 0.6, 0.3, 0.45, 0.7, 0.8, 0.65]:
        out, state = ctl.update(state, ControlInput(vote=0.9, kl=kl))
        betas.append(out.beta)
        reasons.append(out.reason)
    # trip (no advantage scale: a gain step), dead step, KL 0.3 and 0.45 < 0.5 at the raise: hold; 0.7: raise;
    # dead step; 0.65 < 0.7: hold
    assert betas == pytest.approx([0.015, 0.015, 0.015, 0.015, 0.0225, 0.0225, 0.0225])
    assert reasons[2] == (
        "held beta 0.015: vote 0.90 >= trip 0.3 for 3 steps, but the KL to the reference has fallen since the "
        "last raise (0.5 -> 0.3 nats/token), so the raised beta is already pulling the policy back"
    )
    assert state.raise_kl == 0.7
    # the mitigation log redacts credentials ("token: x"): the reasons must reach it whole
    assert redact_secrets(reasons[2]) == reasons[2]
    assert redact_secrets(reasons[1]) == reasons[1]
    off = BangBang(dwell_steps=1, memory_half_life=0, hold_receding=False)
    state = off.init(0.01)
    for kl in [0.5, 0.6, 0.3]:
        out, state = off.update(state, ControlInput(vote=0.9, kl=kl))
    assert out.beta == pytest.approx(0.01 * 1.5**3)


def test_a_new_trip_after_relaxing_is_not_held_by_an_old_raise():
    ctl = BangBang(dwell_steps=1, release_patience=1, memory_half_life=50)
    state = ctl.init(0.01)
    for vote, kl in [(0.9, 1.0), (0.9, 1.0), (0.9, 1.2), (0.0, 0.1)]:  # trip, dead step, raise, relax
        out, state = ctl.update(state, ControlInput(vote=vote, kl=kl))
    assert out.direction == "hold"
    assert state.floor_beta is not None  # first relaxing step: remembered
    assert state.tripped
    assert state.raise_kl is None
    assert state.raise_step is None
    before = out.beta
    out, state = ctl.update(state, ControlInput(vote=0.9, kl=0.2))  # the flaw pays again at a lower KL
    assert out.direction == "raise"
    assert out.beta == pytest.approx(before * 1.5)


def test_once_relaxing_one_noisy_batch_does_not_raise_again_but_two_in_a_row_do():
    # the dwell that keeps one noisy batch from tripping also guards a relaxing beta: a trip raises on each
    # high vote until its first relaxing step, then a raise needs dwell_steps high votes in a row again
    ctl = BangBang(memory_half_life=0, size_fraction=0)
    votes = [0.5, 0.5, 0.2, 0.5, 0.05, 0.05, 0.05, 0.5, 0.05, 0.5, 0.5]
    outputs, states = run(ctl, votes, 0.01)
    # dwell 1 of 2; trip (x1.5); band; still raising (x1.5); 3 healthy steps: relax (/1.5); one high vote:
    # hold; healthy; two high votes in a row: raise again
    expected = [0.01, 0.015, 0.015, 0.0225, 0.0225, 0.0225, 0.015, 0.015, 0.015, 0.015, 0.0225]
    assert [o.beta for o in outputs] == pytest.approx(expected)
    assert states[7].tripped
    assert outputs[7].reason == (
        "held beta 0.015: vote 0.50 >= trip 0.3 for 1 of 2 steps needed to raise again"
    )
    assert [o.components["held_dwell"] for o in outputs] == [0.0] * 7 + [1.0, 0.0, 1.0, 0.0]
    assert outputs[10].direction == "raise"
    assert [o.beta for o in outputs] == pytest.approx(reference_betas(votes, 0.01))


def test_at_the_ceiling_the_hold_is_the_ceilings():
    outputs, _ = run(BangBang(beta_ceil=0.02, memory_half_life=0), [0.9] * 5, 0.01)
    assert [o.beta for o in outputs] == pytest.approx([0.01, 0.015, 0.015, 0.02, 0.02])
    assert outputs[4].reason == "held beta at the ceiling 0.02: vote 0.90 >= trip 0.3 for 5 steps"


def test_the_last_raise_survives_a_json_round_trip():
    ctl = BangBang(dwell_steps=1)
    _, state = ctl.update(ctl.init(0.01), ControlInput(vote=0.9, kl=0.4))
    restored = BangBangState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    assert restored.raise_kl == 0.4
    assert restored.raise_step == 1
    for kl in [0.5, 0.3]:
        out_a, state = ctl.update(state, ControlInput(vote=0.9, kl=kl))
        out_b, restored = ctl.update(restored, ControlInput(vote=0.9, kl=kl))
        assert out_a == out_b
