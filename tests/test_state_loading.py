"""Saved states load all or nothing: every field validated, unknown keys and versions refused, no half-load.

The property tests mutate valid states at random (a field replaced by NaN, a string, a huge number, a key
deleted or added, a list cut short, ...) and check the contract of every ``load_state_dict`` / ``from_dict``:
either it raises :class:`~loopguard.ConfigError` (a :class:`~loopguard.StateError`) and the object is exactly
as it was, or the state is accepted and then behaves like any reachable state: it round-trips, and a twin
loaded from its round trip makes the same, finite decisions.
"""

import copy
import json
import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopguard import (
    AdaptiveKL,
    EscalationLadder,
    Guard,
    InfoRM,
    JudgeGap,
    Observation,
    PIDLagrangian,
    RMEnsemble,
    StateError,
)
from loopguard.adapters.loop import LoopGuard
from loopguard.control import (
    AdaptiveKLState,
    BangBang,
    BangBangState,
    ControlInput,
    LadderState,
    PIDLagrangianState,
)
from loopguard.integrations import GuardedKLController

WORDS = [f"w{i}" for i in range(120)]
B, G = 16, 4


def _embed(texts):
    """A deterministic toy embedding: letter counts of each text (enough to exercise InfoRM's memory)."""
    return np.array([[text.count(c) for c in "w0123456789 "] for text in texts], dtype=float)


def _judged(rewards, hacked=False):
    """The trained reward, a judge on another scale (blind to the loop's bonus) and an unrelated function."""
    wiggle = np.cos(np.arange(len(rewards)))
    judge = 3.0 * (rewards - 2.0 * hacked) + 1.0 + 0.3 * wiggle
    return [rewards, judge, 40.0 + 10.0 * np.sin(7.0 * np.arange(len(rewards)))]


def _healthy(step, rng, *, beta=None):
    texts = [" ".join(rng.choice(WORDS, size=12)) for _ in range(B)]
    rewards = rng.normal(size=B)
    return Observation(
        step, rewards, completions=texts, group_size=G, beta=beta, kl=0.02, ensemble_scores=_judged(rewards)
    )


def _looping(step, rng, *, beta=None):
    texts = ["x y " * 6] * B
    rewards = rng.normal(size=B) + 2.0
    return Observation(
        step,
        rewards,
        completions=texts,
        group_size=G,
        beta=beta,
        kl=0.5,
        ensemble_scores=_judged(rewards, True),
    )


# Each factory builds a fresh object with one configuration; the same factory builds the twin.
GUARDS = {
    "kl_control": lambda: Guard(
        mode="kl_control",
        beta=0.01,
        warmup_steps=5,
        ladder=EscalationLadder(rollback_patience=2, stop_patience=2, max_rollbacks=1, cooldown_steps=3),
    ),
    "pid": lambda: Guard(mode="pid_lagrangian", beta=0.01, warmup_steps=5),
    "adaptive": lambda: Guard(
        mode="adaptive_kl", beta=0.01, warmup_steps=5, controller=AdaptiveKL(target=0.05)
    ),
    "log_only_inform": lambda: Guard(
        mode="log_only",
        warmup_steps=6,
        signals=["repetition", "drift", InfoRM(embed_fn=_embed, min_samples=3)],
    ),
    "judges": lambda: Guard(
        mode="log_only",
        warmup_steps=5,
        signals=["repetition", JudgeGap(members=3), RMEnsemble(min_agreement=0.5)],
    ),
    "judges_no_reference": lambda: Guard(
        mode="log_only",
        warmup_steps=5,
        reference_steps=0,
        signals=["repetition", JudgeGap(), RMEnsemble(standardize=True)],
    ),
}


def _run(guard, steps, *, hack_from=None, seed=0):
    rng = np.random.default_rng(seed)
    for step in range(steps):
        looping = hack_from is not None and step >= hack_from
        guard.step((_looping if looping else _healthy)(step, rng, beta=0.01))
    return guard


def _states():
    """(name, factory, saved state) for Guards in different phases: warming up, healthy, tripped, stopped."""
    out = []
    for name, factory in GUARDS.items():
        for label, steps, hack_from in (("warming", 3, None), ("healthy", 12, None), ("tripped", 14, 9)):
            out.append((f"{name}-{label}", factory, _run(factory(), steps, hack_from=hack_from).state_dict()))
    out.append(("stopped", GUARDS["kl_control"], _run(GUARDS["kl_control"](), 20, hack_from=6).state_dict()))
    assert out[-1][2]["stopped_reason"] is not None
    return out


STATES = _states()


# --------------------------------------------------------------------------------------- mutations


def _paths(tree, prefix=()):
    """Every path into a JSON tree (dict keys and list indices), the root included."""
    yield prefix
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from _paths(value, (*prefix, index))


HOSTILE = st.one_of(
    st.sampled_from(
        [
            math.nan,
            math.inf,
            -math.inf,
            -1,
            0,
            1,
            -0.5,
            0.5,
            2,
            1e308,
            10**20,
            -(10**20),
            True,
            False,
            None,
            "",
            "0.1",
            "nan",
            [],
            {},
            [1.0],
            {"x": 1},
            [math.nan],
            [[]],
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**25), max_value=10**25),
    st.text(max_size=4),
)


@st.composite
def mutations(draw, state):
    """A mutated deep copy of ``state`` and a description of what was done."""
    mutated = copy.deepcopy(state)
    paths = list(_paths(mutated))
    path = draw(st.sampled_from(paths))
    parent = mutated
    for key in path[:-1]:
        parent = parent[key]
    target = parent[path[-1]] if path else mutated
    ops = ["replace"] if path else []
    if path and isinstance(parent, dict):
        ops.append("delete")
    if isinstance(target, dict):
        ops.append("add_key")
    if isinstance(target, list) and target:
        ops += ["truncate", "append"]
    if not ops:
        ops = ["add_key"] if isinstance(mutated, dict) else ["replace"]
        target, path = mutated, ()
    op = draw(st.sampled_from(ops))
    value = draw(HOSTILE)
    if op == "replace":
        parent[path[-1]] = value
    elif op == "delete":
        del parent[path[-1]]
    elif op == "add_key":
        target[draw(st.sampled_from(["extra", "x", "", "version2"]))] = value
    elif op == "truncate":
        del target[draw(st.integers(0, len(target) - 1)) :]
    else:
        target.append(value)
    return mutated, f"{op} at {list(path)} with {value!r}"


def _refused(load, state):
    """The StateError ``load(state)`` raised, or None when it accepted the state (anything else propagates)."""
    try:
        load(state)
    except StateError as error:
        return error
    return None


def _snapshot(obj):
    return json.dumps(obj.state_dict(), sort_keys=True)


def _check_loaded_behaves(obj, factory, steps, decide):
    """An accepted state round-trips and makes the same, sane decisions as a twin loaded from the round trip."""
    saved = json.loads(json.dumps(obj.state_dict()))
    twin = factory()
    twin.load_state_dict(saved)
    assert _snapshot(twin) == _snapshot(obj)
    rng_a, rng_b = np.random.default_rng(99), np.random.default_rng(99)
    for step in range(steps):
        first, second = decide(obj, step, rng_a), decide(twin, step, rng_b)
        if first is None:
            continue
        assert first.to_dict() == second.to_dict()
        assert math.isfinite(first.vote)
        assert 0.0 <= first.vote <= 1.0
        assert first.beta_after is None or (math.isfinite(first.beta_after) and first.beta_after > 0)


def _check_all_or_nothing(factory, state, mutated, what, steps, decide):
    """Load ``state`` into a fresh object, then ``mutated``: refused and unchanged, or accepted and sane."""
    obj = factory()
    obj.load_state_dict(state)
    before = _snapshot(obj)
    if _refused(obj.load_state_dict, mutated) is not None:
        assert _snapshot(obj) == before, f"changed by a refused load ({what})"
        return None
    _check_loaded_behaves(obj, factory, steps, decide)
    return obj


def _guard_decide(guard, step, rng):
    return guard.step(_healthy(1000 + step, rng, beta=0.01))


@pytest.mark.parametrize(("name", "factory", "state"), STATES, ids=[s[0] for s in STATES])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_guard_load_is_all_or_nothing(name, factory, state, data):
    mutated, what = data.draw(mutations(state))
    _check_all_or_nothing(factory, state, mutated, what, 4, _guard_decide)


def _controller_factory():
    return GuardedKLController(
        Guard(mode="kl_control", beta=0.05, warmup_steps=3, ladder=EscalationLadder(max_rollbacks=0)),
        init_kl_coef=0.05,
    )


def _controller_state():
    controller = _controller_factory()
    rng = np.random.default_rng(3)
    for step in range(8):
        controller.update(current_kl=0.01 * step, n_steps=16)
        controller.observe(rng.normal(size=B), completions=[" ".join(rng.choice(WORDS, 8)) for _ in range(B)])
    return controller.state_dict()


def _controller_decide(controller, step, rng):
    controller.update(current_kl=0.02, n_steps=16)
    return controller.observe(
        rng.normal(size=B), completions=[" ".join(rng.choice(WORDS, 8)) for _ in range(B)]
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_kl_controller_load_is_all_or_nothing(data):
    state = _controller_state()
    mutated, what = data.draw(mutations(state))
    controller = _check_all_or_nothing(_controller_factory, state, mutated, what, 3, _controller_decide)
    if controller is not None:
        assert math.isfinite(controller.value)
        assert controller.value > 0


def _loop_factory():
    return LoopGuard(GUARDS["kl_control"](), set_beta=lambda beta: None)


def _loop_decide(loop, step, rng):
    return loop.step(_healthy(1000 + step, rng, beta=0.01)).decision


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_loop_guard_load_is_all_or_nothing(data):
    loop = _loop_factory()
    rng = np.random.default_rng(5)
    for step in range(12):
        loop.step((_looping if step >= 8 else _healthy)(step, rng, beta=0.01))
    state = loop.state_dict()
    mutated, what = data.draw(mutations(state))
    _check_all_or_nothing(_loop_factory, state, mutated, what, 3, _loop_decide)


def _vote(vote):
    return ControlInput(vote=vote)


CONTROL_STATES = [
    (BangBangState, BangBang(), lambda c: c.update(c.update(c.init(0.01), _vote(0.9))[1], _vote(0.9))[1]),
    (
        PIDLagrangianState,
        PIDLagrangian(),
        lambda c: c.update(c.update(c.init(0.01), _vote(0.9))[1], _vote(0.2))[1],
    ),
    (AdaptiveKLState, AdaptiveKL(), lambda c: c.update(c.init(0.01), ControlInput(kl=9.0, batch_size=64))[1]),
    (
        LadderState,
        EscalationLadder(rollback_patience=1, max_rollbacks=1),
        lambda c: c.update(c.update(c.init(), hacking=True, can_rollback=True)[1], hacking=False)[1],
    ),
]


@pytest.mark.parametrize(
    ("state_type", "controller", "make"), CONTROL_STATES, ids=lambda v: getattr(v, "__name__", "")
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_control_from_dict_refuses_with_state_error_or_builds_a_valid_state(
    state_type, controller, make, data
):
    state = make(controller)
    mutated, _ = data.draw(mutations(state.to_dict()))
    rebuilt = []
    if _refused(lambda payload: rebuilt.append(state_type.from_dict(payload)), mutated) is not None:
        return
    rebuilt = rebuilt[0]
    assert rebuilt.to_dict() == json.loads(json.dumps(rebuilt.to_dict()))
    assert state_type.from_dict(rebuilt.to_dict()) == rebuilt


# ------------------------------------------------------------------------------ the issue's own cases


def test_a_nan_baseline_is_refused_instead_of_reading_hack_every_step():
    guard = _run(GUARDS["kl_control"](), 12)
    text = json.dumps(guard.state_dict())
    state = json.loads(text)  # Python's json accepts NaN: a corrupted file can carry one
    state["detectors"]["repetition"]["baseline"]["rate"][0] = math.nan
    fresh = GUARDS["kl_control"]()
    with pytest.raises(
        StateError,
        match=re.escape("`state['detectors']['repetition']['baseline']['rate'][0]` must be finite, got nan."),
    ):
        fresh.load_state_dict(state)
    assert fresh.state_dict()["seen"] == 0  # nothing was applied


def test_a_truncated_state_raises_state_error_and_changes_nothing():
    guard = _run(GUARDS["pid"](), 12)
    state = guard.state_dict()
    del state["ladder"], state["said"]
    fresh = _run(GUARDS["pid"](), 3)
    before = _snapshot(fresh)
    with pytest.raises(StateError, match=re.escape("got missing ['ladder', 'said'], unexpected []")):
        fresh.load_state_dict(state)
    assert _snapshot(fresh) == before


def test_a_string_value_never_reaches_the_engine_as_a_coefficient():
    state = _controller_state()
    for bad in ("nan", "0.1", math.nan, -0.1, 0.0, True):
        controller = _controller_factory()
        with pytest.raises(StateError, match=re.escape("`state['value']`")):
            controller.load_state_dict({**state, "value": bad})
        assert controller.value == 0.05


def test_a_value_that_contradicts_the_guard_is_refused():
    state = _controller_state()
    with pytest.raises(
        StateError, match=re.escape("`state['value']` must equal the Guard's beta 0.05, got 0.5.")
    ):
        _controller_factory().load_state_dict({**state, "value": 0.5})


def written_by(state, version):
    """A Guard state as loopguard wrote it at ``version``: 1 kept no episode, 1-2 no reference sample, 1-3 no
    targeted penalty and no ceiling count, 1-4 no sustained evidence, 1-5 no pooled pricing."""
    state = {key: value for key, value in state.items() if key != "pricing"}
    if version == 5:
        return {**state, "version": 5}
    state = {
        **state,
        "detectors": {
            name: {key: value for key, value in memory.items() if key != "evidence"}
            for name, memory in state["detectors"].items()
        },
    }
    if version == 4:
        return {**state, "version": 4}
    newer = ("penalty", "candidates", "ceiling_steps")
    old = {key: value for key, value in state.items() if key not in newer}
    if version == 3:
        return {**old, "version": 3}
    old = {key: value for key, value in old.items() if key != "reference_batches"}
    old["config"] = {key: value for key, value in state["config"].items() if key != "reference_steps"}
    old["detectors"] = {
        name: {key: value for key, value in memory.items() if key != "reference"}
        for name, memory in state["detectors"].items()
    }
    if version == 1:
        del old["episode"]
    return {**old, "version": version}


def test_unknown_keys_and_versions_are_refused():
    state = _run(GUARDS["kl_control"](), 8).state_dict()
    with pytest.raises(StateError, match=re.escape("unexpected ['beta_floor']")):
        GUARDS["kl_control"]().load_state_dict({**state, "beta_floor": 0.5})
    with pytest.raises(StateError, match=re.escape("`state['version']` must be 6, got 7.")):
        GUARDS["kl_control"]().load_state_dict({**state, "version": 7})
    with pytest.raises(StateError, match=re.escape("unexpected ['pricing']")):
        GUARDS["kl_control"]().load_state_dict({**state, "version": 5})  # version 5 had no pooled pricing
    five = written_by(state, 5)
    with pytest.raises(StateError, match=re.escape("unexpected ['evidence']")):
        GUARDS["kl_control"]().load_state_dict({**five, "version": 4})  # version 4 had no sustained evidence
    four = written_by(state, 4)
    with pytest.raises(StateError, match=re.escape("unexpected ['candidates', 'ceiling_steps', 'penalty']")):
        GUARDS["kl_control"]().load_state_dict({**four, "version": 3})  # version 3 had no targeted penalty
    three = written_by(state, 3)
    with pytest.raises(StateError, match=re.escape("unexpected ['reference_batches']")):
        GUARDS["kl_control"]().load_state_dict({**three, "version": 2})  # version 2 had no reference sample
    with pytest.raises(StateError, match=re.escape("`state['kind']` must be 'loopguard.LoopGuard'")):
        _loop_factory().load_state_dict({"kind": "loopguard.RewardHackMitigator", "version": 2})


def _tripped_loop():
    """A LoopGuard whose Guard is in a hack episode (the loop falls into an echo from step 8), and its onset."""
    loop = _loop_factory()
    rng = np.random.default_rng(5)
    verdicts = {}
    for step in range(11):
        decision = loop.step((_looping if step >= 8 else _healthy)(step, rng, beta=0.01)).decision
        verdicts[step] = decision.verdict
    onset = min(step for step, verdict in verdicts.items() if verdict != "OK")
    assert onset >= 8
    assert all(verdicts[step] != "OK" for step in range(onset, 11))
    assert loop.guard.onset == loop.last_decision.onset == onset
    return loop, onset


def test_the_loop_guard_state_keeps_the_onset_in_the_guard():
    loop, onset = _tripped_loop()
    state = loop.state_dict()
    assert state["version"] == 2
    assert set(state) == {"kind", "version", "guard", "rollbacks"}
    assert state["guard"]["version"] == 6
    assert state["guard"]["episode"]["onset"] == onset
    twin = _loop_factory()
    twin.load_state_dict(json.loads(json.dumps(state)))
    assert twin.guard.onset == twin.onset == onset


def test_a_version_1_loop_guard_state_still_loads_and_gives_its_onset_to_the_guard():
    state = json.loads(json.dumps(_tripped_loop()[0].state_dict()))
    old = {**state, "version": 1, "onset": 6, "guard": written_by(state["guard"], 1)}  # as loopguard wrote it
    twin = _loop_factory()
    twin.load_state_dict(old)
    assert twin.guard.onset == twin.onset == 6
    assert twin.state_dict()["version"] == 2
    assert "onset" not in twin.state_dict()
    assert twin.state_dict()["guard"]["episode"]["onset"] == 6
    with pytest.raises(StateError, match=re.escape("got missing ['onset'], unexpected []")):
        _loop_factory().load_state_dict({**state, "version": 1})  # version 1 had the onset
    with pytest.raises(StateError, match=re.escape("unexpected ['onset']")):
        _loop_factory().load_state_dict({**state, "onset": 6})  # version 2 has not


def test_a_version_1_guard_state_still_loads_with_a_fresh_episode():
    guard = _run(GUARDS["kl_control"](), 30)  # past the warm-up: the reference has done its work
    twin = GUARDS["kl_control"]()
    twin.load_state_dict(written_by(guard.state_dict(), 1))
    assert twin.onset is None
    assert twin.healthy
    expected = {**guard.state_dict(), "episode": twin.state_dict()["episode"], "reference_batches": 0}
    expected["detectors"] = {
        name: {**memory, "reference": {}, "evidence": {}} for name, memory in expected["detectors"].items()
    }
    assert twin.state_dict() == expected


def test_a_version_3_guard_state_resumes_without_a_penalty():
    guard = _run(GUARDS["kl_control"](), 30)
    twin = GUARDS["kl_control"]()
    twin.load_state_dict(written_by(guard.state_dict(), 3))
    assert twin.penalty is None
    observation = _healthy(31, np.random.default_rng(1), beta=guard.beta)
    assert twin.step(observation).scores == guard.step(observation).scores


def test_a_version_2_guard_state_resumes_with_the_reference_sample_on():
    guard = _run(GUARDS["kl_control"](), 30)
    twin = GUARDS["kl_control"]()
    twin.load_state_dict(written_by(guard.state_dict(), 2))
    assert twin.reference_steps == 3
    assert twin.reference_batches == 0
    observation = _healthy(31, np.random.default_rng(1), beta=guard.beta)
    assert twin.step(observation).scores == guard.step(observation).scores  # the baseline decides now


def test_a_state_from_another_controller_configuration_is_refused():
    guard = _run(
        Guard(mode="kl_control", beta=0.01, warmup_steps=5, controller=BangBang(gain=10.0, beta_ceil=5.0)),
        14,
        hack_from=6,
    )
    state = guard.state_dict()
    assert state["beta"] > 1.0
    with pytest.raises(
        StateError, match=re.escape("must be in this controller's [beta_floor, beta_ceil] = [1e-06, 1]")
    ):
        Guard(mode="kl_control", beta=0.01, warmup_steps=5).load_state_dict(state)
