import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, LoopguardTypeError, StateError
from loopguard.control import (
    AdaptiveKL,
    BangBang,
    ControlInput,
    EscalationLadder,
    LadderOutput,
    LadderState,
    PIDLagrangian,
)


def reference_ladder(steps, *, rollback_patience, stop_patience, max_rollbacks, cooldown_steps):
    """The ladder's rules written out plainly: returns (action, in_cooldown) per step."""
    out, streak, rollbacks, cooldown_until, stopped = [], 0, 0, 0, False
    for t, (hacking, can_rollback) in enumerate(steps, start=1):
        if stopped:
            out.append(("stop", False))
            continue
        in_cooldown = t <= cooldown_until
        if not hacking:
            streak = 0
            out.append(("none", in_cooldown))
            continue
        streak += 1
        available = rollbacks < max_rollbacks and can_rollback
        if streak >= rollback_patience and available and not in_cooldown:
            rollbacks, streak, cooldown_until = rollbacks + 1, 0, t + cooldown_steps
            out.append(("rollback", cooldown_steps > 0))
        elif not available and streak >= stop_patience:
            stopped = True
            out.append(("stop", False))
        else:
            out.append(("raise_beta", in_cooldown))
    return out


def run(ladder, steps):
    state = ladder.init()
    outputs, states = [], []
    for hacking, can_rollback in steps:
        output, state = ladder.update(state, hacking=hacking, can_rollback=can_rollback)
        outputs.append(output)
        states.append(state)
    return outputs, states


HAND = [
    # (hacking, action, rung, in_cooldown) for rollback_patience 3, stop_patience 2, max_rollbacks 1, cooldown 2
    (True, "raise_beta", 1, False),
    (False, "none", 0, False),
    (True, "raise_beta", 1, False),
    (True, "raise_beta", 1, False),
    (True, "rollback", 2, True),  # 3 in a row
    (True, "raise_beta", 2, True),  # cooldown step 1 of 2
    (False, "none", 2, True),  # cooldown step 2 of 2: the rung does not drop
    (True, "raise_beta", 1, False),  # rollbacks used up: stop after 2 in a row
    (True, "stop", 3, False),
    (False, "stop", 3, False),  # terminal
]


def test_hand_computed_sequence_and_reasons():
    ladder = EscalationLadder(rollback_patience=3, stop_patience=2, max_rollbacks=1, cooldown_steps=2)
    outputs, states = run(ladder, [(h, True) for h, *_ in HAND])
    assert [(o.action, o.rung, o.in_cooldown) for o in outputs] == [tuple(row[1:]) for row in HAND]
    assert isinstance(outputs[0], LadderOutput)
    assert outputs[0].reason == "hacking for 1 step in a row: raise beta; rollback after 3 in a row"
    assert outputs[1].reason == "healthy for 1 step in a row: no action"
    assert outputs[4].reason == (
        "roll back to the last good checkpoint (rollback 1 of 1): hacking persisted for 3 steps in a row "
        "while beta was raised; cooldown of 2 steps with no further rollback and no lowering of beta"
    )
    assert outputs[5].reason == (
        "hacking for 1 step in a row: raise beta; cooldown after rollback: 1 step left, beta is not lowered; "
        "the rollback budget is used up (1 of 1), stop after 2 in a row"
    )
    assert outputs[6].reason == (
        "healthy for 1 step in a row: no action; cooldown after rollback: 0 steps left, beta is not lowered"
    )
    assert outputs[7].reason == (
        "hacking for 1 step in a row: raise beta; the rollback budget is used up (1 of 1), stop after 2 in a row"
    )
    assert outputs[8].reason.startswith(
        "stop training: hacking persisted for 2 steps in a row and the rollback budget is used up (1 of 1); "
        "7 hacking steps in all. Raising beta did not stop it. To go on, try a higher beta_ceil"
    )
    assert outputs[9].reason.startswith("training was stopped at step 9; the ladder is terminal")
    last = states[-1]
    assert (last.step, last.total_hacking_steps, last.total_rollbacks, last.stop_step) == (10, 7, 1, 9)
    assert last.last_rollback_step == 5
    assert outputs[4].components["total_rollbacks"] == 1.0
    assert outputs[4].components["cooldown_left"] == 2.0
    assert outputs[4].components["consecutive_hacking"] == 0.0  # reset by the rollback


def test_no_checkpoint_means_stop_after_stop_patience():
    ladder = EscalationLadder(rollback_patience=2, stop_patience=3)
    outputs, _ = run(ladder, [(True, False)] * 3)
    assert [o.action for o in outputs] == ["raise_beta", "raise_beta", "stop"]
    assert (
        "there is no good checkpoint to roll back to (0 of 2 rollbacks made); 3 hacking steps"
        in outputs[2].reason
    )
    outputs, _ = run(EscalationLadder(max_rollbacks=0, stop_patience=1), [(True, True)])
    assert outputs[0].action == "stop"
    assert "rollbacks are disabled (max_rollbacks=0)" in outputs[0].reason


def test_zero_cooldown_allows_back_to_back_rollbacks():
    ladder = EscalationLadder(rollback_patience=1, max_rollbacks=2, cooldown_steps=0, stop_patience=1)
    outputs, _ = run(ladder, [(True, True)] * 3)
    assert [(o.action, o.in_cooldown) for o in outputs] == [
        ("rollback", False),
        ("rollback", False),
        ("stop", False),
    ]


@st.composite
def ladders(draw):
    return EscalationLadder(
        rollback_patience=draw(st.integers(1, 5)),
        stop_patience=draw(st.integers(1, 5)),
        max_rollbacks=draw(st.integers(0, 3)),
        cooldown_steps=draw(st.integers(0, 6)),
    )


hacking_st = st.lists(st.tuples(st.booleans(), st.booleans()), max_size=80)
always_can_st = st.lists(st.tuples(st.booleans(), st.just(True)), max_size=80)


@settings(max_examples=50, deadline=None)
@given(
    ladders(),
    st.one_of(hacking_st, always_can_st, st.lists(st.tuples(st.just(True), st.booleans()), max_size=40)),
)
def test_matches_reference_and_ladder_invariants(ladder, steps):
    outputs, states = run(ladder, steps)
    expected = reference_ladder(
        steps,
        rollback_patience=ladder.rollback_patience,
        stop_patience=ladder.stop_patience,
        max_rollbacks=ladder.max_rollbacks,
        cooldown_steps=ladder.cooldown_steps,
    )
    assert [(o.action, o.in_cooldown) for o in outputs] == expected
    rollback_steps = [t for t, o in enumerate(outputs) if o.action == "rollback"]
    previous = ladder.init()
    stopped = False
    for t, (output, state, (hacking, _)) in enumerate(zip(outputs, states, steps, strict=True)):
        # never a rollback inside the cooldown of an earlier one
        assert not any(
            s < t <= s + ladder.cooldown_steps for s in rollback_steps if output.action == "rollback"
        )
        # the rung never drops below "rollback" during a cooldown
        if output.in_cooldown:
            assert output.rung >= 2
        assert (
            output.rung
            == {
                "none": output.rung if output.in_cooldown else 0,
                "raise_beta": 2 if output.in_cooldown else 1,
                "rollback": 2,
                "stop": 3,
            }[output.action]
        )
        # stop is terminal
        if stopped:
            assert output.action == "stop"
        stopped = stopped or output.action == "stop"
        if not stopped:
            assert (output.action == "none") == (not hacking)
        # a rollback needs rollback_patience hacking steps in a row since the last healthy step or rollback
        if output.action == "rollback":
            assert previous.consecutive_hacking + 1 >= ladder.rollback_patience
        # totals never decrease and never reset; rollbacks stay within budget
        assert state.total_hacking_steps >= previous.total_hacking_steps
        assert state.total_rollbacks >= previous.total_rollbacks
        assert state.total_rollbacks <= ladder.max_rollbacks
        previous = state


@settings(max_examples=50, deadline=None)
@given(ladders(), always_can_st)
def test_never_stops_before_the_allowed_rollbacks_when_rollback_is_possible(ladder, steps):
    outputs, _ = run(ladder, steps)
    for output in outputs:
        if output.action == "stop":
            assert output.components["total_rollbacks"] == ladder.max_rollbacks
            break


@settings(max_examples=50, deadline=None)
@given(ladders(), hacking_st, hacking_st)
def test_json_round_trip_mid_sequence_gives_identical_future(ladder, before, after):
    state = ladder.init()
    for hacking, can in before:
        _, state = ladder.update(state, hacking=hacking, can_rollback=can)
    restored = LadderState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    for hacking, can in after:
        out_a, state = ladder.update(state, hacking=hacking, can_rollback=can)
        out_b, restored = ladder.update(restored, hacking=hacking, can_rollback=can)
        assert out_a == out_b
        assert state == restored


@pytest.mark.parametrize(
    "controller", [BangBang(dwell_steps=1, release_patience=1), PIDLagrangian(), AdaptiveKL(rule="ppo")]
)
def test_cooldown_keeps_every_controller_from_lowering_beta(controller):
    # The Guard's wiring: allow_lower = not ladder_output.in_cooldown. After a rollback, healthy steps inside
    # the cooldown must not lower beta, whichever controller is in use; after the cooldown they may.
    ladder = EscalationLadder(rollback_patience=2, cooldown_steps=5)
    ladder_state, state = ladder.init(), controller.init(0.04)
    measurements = (
        [0.9, 0.9] + [0.0] * 10 if not isinstance(controller, AdaptiveKL) else [50.0, 50.0] + [0.0] * 10
    )
    rows = []
    for value in measurements:
        hacking = value >= 0.3 if not isinstance(controller, AdaptiveKL) else value > 9.0
        step, ladder_state = ladder.update(ladder_state, hacking=hacking)
        signal = (
            ControlInput(kl=value, batch_size=1)
            if isinstance(controller, AdaptiveKL)
            else ControlInput(vote=value)
        )
        out, state = controller.update(state, signal, allow_lower=not step.in_cooldown)
        rows.append((step.action, step.in_cooldown, out.direction))
    assert rows[1][0] == "rollback"
    assert all(in_cooldown for _, in_cooldown, _ in rows[1:7])
    assert all(direction != "lower" for _, _, direction in rows[:7])
    assert not rows[7][1]
    assert any(direction == "lower" for _, _, direction in rows[7:])


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rollback_patience": 0}, ConfigError, "`rollback_patience` must be >= 1, got 0."),
        (
            {"stop_patience": True},
            LoopguardTypeError,
            "`stop_patience` must be an integer (not bool), got True.",
        ),
        ({"stop_patience": 0}, ConfigError, "`stop_patience` must be >= 1, got 0."),
        ({"max_rollbacks": -1}, ConfigError, "`max_rollbacks` must be >= 0, got -1."),
        ({"cooldown_steps": -1}, ConfigError, "`cooldown_steps` must be >= 0, got -1."),
        (
            {"cooldown_steps": 2.5},
            LoopguardTypeError,
            "`cooldown_steps` must be an integer, got 2.5 of type float.",
        ),
    ],
)
def test_bad_config(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        EscalationLadder(**kwargs)


def test_bad_update_arguments():
    ladder = EscalationLadder()
    with pytest.raises(LoopguardTypeError, match=re.escape("`hacking` must be a bool, got 1 of type int.")):
        ladder.update(ladder.init(), hacking=1)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`can_rollback` must be a bool, got None of type NoneType.")
    ):
        ladder.update(ladder.init(), hacking=True, can_rollback=None)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`state` must be a LadderState (from EscalationLadder.init")
    ):
        ladder.update(BangBang().init(0.1), hacking=True)


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (
            lambda d: d.update(consecutive_hacking=1, consecutive_healthy=1, total_hacking_steps=1, step=2),
            ConfigError,
            "`consecutive_hacking` and `consecutive_healthy` cannot both be > 0, got 1 and 1.",
        ),
        (
            lambda d: d.update(total_hacking_steps=3),
            ConfigError,
            "`total_hacking_steps` must be in [consecutive_hacking, step] = [0, 0], got 3.",
        ),
        (
            lambda d: d.update(last_rollback_step=0),
            ConfigError,
            "`state.last_rollback_step` must be >= 1, got 0.",
        ),
        (
            lambda d: d.update(stop_step="3"),
            StateError,
            "`state.stop_step` must be an integer, got '3'",
        ),
        (lambda d: d.update(version=True), ConfigError, "`state['version']` must be 1, got True."),
        (lambda d: d.pop("kind"), ConfigError, "got missing ['kind'], unexpected []."),
    ],
)
def test_from_dict_validates(mutate, error, message):
    payload = EscalationLadder().init().to_dict()
    mutate(payload)
    with pytest.raises(error, match=re.escape(message)):
        LadderState.from_dict(payload)


def test_to_dict_is_plain_json():
    ladder = EscalationLadder(rollback_patience=1)
    _, states = run(ladder, [(True, True)])
    assert states[-1].to_dict() == {
        "kind": "LadderState",
        "version": 1,
        "step": 1,
        "consecutive_hacking": 0,
        "consecutive_healthy": 0,
        "total_hacking_steps": 1,
        "total_rollbacks": 1,
        "cooldown_left": 20,
        "last_rollback_step": 1,
        "stop_step": None,
        "shaped_step": None,
    }
    assert not states[-1].stopped


def test_a_state_saved_before_the_targeted_rung_loads():
    payload = EscalationLadder().init().to_dict()
    del payload["shaped_step"]
    assert LadderState.from_dict(payload).shaped_step is None


# ------------------------------------------------------------------------------------------ targeted rung


def _walk(ladder, steps, *, can_rollback=True, can_shape=True):
    state, outs = ladder.init(), []
    for hacking in steps:
        out, state = ladder.update(state, hacking=hacking, can_rollback=can_rollback, can_shape=can_shape)
        outs.append(out)
    return outs, state


def test_targeted_rung_comes_after_shape_patience_before_any_rollback_and_only_once():
    ladder = EscalationLadder(
        rollback_patience=3, stop_patience=3, shape_patience=2, max_rollbacks=1, cooldown_steps=0
    )
    outs, state = _walk(ladder, [True] * 9)
    assert [(o.action, o.shape) for o in outs] == [
        ("raise_beta", False),
        ("raise_beta", True),  # shape_patience 2: the penalty goes on; the streak resets
        ("raise_beta", False),
        ("raise_beta", False),
        ("rollback", False),  # then the ladder goes on as before: rollback after 3 more
        ("raise_beta", False),
        ("raise_beta", False),
        ("stop", False),
        ("stop", False),
    ]
    assert state.shaped_step == 2
    assert "targeted penalty" in outs[1].reason


def test_targeted_rung_rides_with_a_rollback_that_is_due_and_replaces_a_stop():
    late = EscalationLadder(rollback_patience=2, shape_patience=2, max_rollbacks=1, cooldown_steps=0)
    outs, _ = _walk(late, [True] * 2)
    assert [(o.action, o.shape) for o in outs] == [("raise_beta", False), ("rollback", True)]
    assert "roll back" in outs[1].reason
    assert "targeted penalty" in outs[1].reason
    none_left = EscalationLadder(rollback_patience=2, stop_patience=2, shape_patience=2, max_rollbacks=1)
    outs, _ = _walk(none_left, [True] * 5, can_rollback=False)
    assert [(o.action, o.shape) for o in outs] == [
        ("raise_beta", False),
        ("raise_beta", True),  # instead of the stop: nothing else was tried
        ("raise_beta", False),
        ("stop", False),
        ("stop", False),
    ]


@pytest.mark.parametrize(("targeted", "can_shape"), [(False, True), (True, False)])
def test_no_targeted_rung_when_off_or_nothing_to_target(targeted, can_shape):
    ladder = EscalationLadder(rollback_patience=2, stop_patience=2, max_rollbacks=0, targeted=targeted)
    outs, state = _walk(ladder, [True] * 2, can_shape=can_shape)
    assert [o.action for o in outs] == ["raise_beta", "stop"]
    assert not any(o.shape for o in outs)
    assert state.shaped_step is None
