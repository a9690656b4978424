"""Every decision lives in the Guard: onset, restore target, health, the checkpoint ledger, presets, objects.

The adapters (TRL callbacks, LoopGuard, the KL-controller drop-in) only carry out what ``Decision`` and the
Guard's ledger say; these tests pin the Guard side and check that a hand-written loop gets the same
checkpoint guarantees as a TRL run (tests/adapters covers the TRL side with real trainers).
"""

from __future__ import annotations

import re

import attrs
import numpy as np
import pytest
import torch
from test_state_loading import written_by

from loopguard import (
    BangBang,
    CheckpointError,
    ConfigError,
    EscalationLadder,
    Guard,
    LoopguardTypeError,
    Observation,
    PIDLagrangian,
    Repetition,
    StateError,
)
from loopguard.adapters.loop import LoopGuard
from loopguard.checkpoint import CheckpointManager
from loopguard.control import BangBangState, ControlInput, ControlOutput
from loopguard.guard import echo_guard
from loopguard.scoring import EMA, Conservative, KOfN, Max, Mean, Median, NoSmoothing

LOOP = "x y " * 8


def healthy(step: int, seed: int = 0) -> Observation:
    rng = np.random.default_rng(seed * 1000 + step)
    words = list("abcdefghijklmnop")
    texts = [" ".join(rng.choice(words, size=12)) for _ in range(16)]
    return Observation(step, rng.normal(size=16), completions=texts, group_size=4)


def hacked(step: int) -> Observation:
    return Observation(step, [5.0 + 0.01 * i for i in range(16)], completions=[LOOP] * 16, group_size=4)


# ------------------------------------------------------------------------------- onset and restore target


def test_decision_carries_the_onset_and_the_rollback_restores_before_it():
    ladder = EscalationLadder(rollback_patience=2, stop_patience=2, max_rollbacks=1, cooldown_steps=1)
    guard = Guard(warmup_steps=3, beta=0.05, ladder=ladder)
    decisions = [guard.step(healthy(step)) for step in range(6)]
    assert all(d.onset is None and d.healthy and d.restore_before is None for d in decisions)
    assert guard.rollback_target(6) == 6  # no episode open: a rollback now would restore before now
    decisions = [guard.step(hacked(step), can_rollback=True) for step in range(6, 14)]
    first_bad = next(d.step for d in decisions if d.verdict != "OK")
    rollback = next(d for d in decisions if d.action == "rollback")
    assert rollback.onset == first_bad
    assert rollback.restore_before == first_bad
    assert not rollback.healthy
    for decision in decisions[: decisions.index(rollback)]:
        if decision.verdict != "OK":
            assert decision.onset == first_bad
    after = decisions[decisions.index(rollback) + 1]
    assert after.onset == after.step  # the restored policy starts a new episode at its first bad step


def test_a_stop_restores_before_the_onset_and_is_never_healthy():
    guard = Guard(warmup_steps=3, beta=0.05, halt_on_hack=True)
    for step in range(5):
        guard.step(healthy(step))
    decisions = [guard.step(hacked(step)) for step in range(5, 12)]
    stop = next(d for d in decisions if d.action == "stop")
    first_bad = next(d.step for d in decisions if d.verdict != "OK")
    assert stop.restore_before == first_bad
    assert not guard.healthy
    assert not guard.step(healthy(40)).healthy  # a stopped Guard never calls a step healthy again


# ------------------------------------------------------------------------------- the checkpoint ledger


def test_a_checkpoint_is_confirmed_only_after_a_healthy_window():
    guard = Guard(mode="log_only", warmup_steps=3)
    for step in range(6):
        guard.step(healthy(step))
    assert guard.confirms(5)  # nothing suspect since step 5
    guard.step(healthy(6))
    assert guard.confirms(5)
    verdicts = [guard.step(hacked(step)).verdict for step in range(8, 11)]
    assert "HACK" in verdicts
    suspect = next(step for step, verdict in zip(range(8, 11), verdicts, strict=True) if verdict != "OK")
    assert not guard.confirms(5)  # a window that saw a suspect step: never good
    assert not guard.confirms(suspect)
    assert guard.confirms(20) or guard.stopped  # saved after the last suspect step: fine once healthy again


def test_every_store_asks_about_its_own_checkpoints():
    """Two stores on one Guard (the mitigator's and an RLCheckpointCallback's) do not steal confirmations."""
    from loopguard.adapters._rollback import Parts, RollbackStore

    guard = Guard(mode="log_only", warmup_steps=3)
    model = torch.nn.Linear(2, 2)
    stores = [RollbackStore(CheckpointManager(in_memory=True), every, guard=guard) for every in (2, 3)]
    for step in range(7):
        guard.step(healthy(step))
        for store in stores:
            store.save(step, Parts(model), main=True)
    assert stores[0].manager.good_steps() == (0, 2, 4)
    assert stores[1].manager.good_steps() == (0, 3)
    assert guard.confirms(4)
    assert guard.confirms(4)  # asking is free of side effects


def test_a_store_only_rollbacks_read_keeps_no_rng_states_and_no_adapter_state():
    """resumable=False (the one-liner's own store in memory) saves what a rollback restores, nothing more."""
    from loopguard.adapters._rollback import Parts, RollbackStore

    model = torch.nn.Linear(2, 2)
    asked: list[int] = []

    def extra_state() -> dict[str, int]:
        asked.append(1)
        return {"beta": 1}

    stores = {
        resumable: RollbackStore(CheckpointManager(in_memory=True), 2, guard=None, resumable=resumable)
        for resumable in (True, False)
    }
    for store in stores.values():
        store.save_initial(Parts(model), main=True, extra_state=extra_state)
        store.save(2, Parts(model), main=True, extra_state=extra_state)
    assert len(asked) == 2  # the adapter's state is not even built for the store that drops it
    for step in (0, 2):
        kept = stores[True].manager.restore(step, torch.nn.Linear(2, 2))  # with the RNG states
        assert kept.extra_state == {"beta": 1}
        target = torch.nn.Linear(2, 2)
        dropped = stores[False].manager.restore(step, target, rng=False)
        assert dropped.extra_state is None
        assert torch.equal(target.weight, model.weight)  # what a rollback restores is all there
        with pytest.raises(CheckpointError, match=re.escape("has no RNG state (saved with rng=False)")):
            stores[False].manager.restore(step, torch.nn.Linear(2, 2))


def test_the_suspect_step_survives_a_state_round_trip():
    guard = Guard(mode="log_only", warmup_steps=3)
    for step in range(4):
        guard.step(healthy(step))
    for step in range(4, 8):
        guard.step(hacked(step))
    copy = Guard(mode="log_only", warmup_steps=3)
    copy.load_state_dict(guard.state_dict())
    assert not copy.confirms(3)
    assert copy.state_dict()["episode"] == guard.state_dict()["episode"]
    with pytest.raises(ConfigError, match="`step` must be >= 0"):
        guard.confirms(-1)


def test_loop_guard_saves_and_confirms_like_a_trl_run():
    """checkpoint_every: saved only while healthy, good only after a window of OK verdicts."""
    model = torch.nn.Linear(2, 2)
    manager = CheckpointManager(in_memory=True)
    loop = LoopGuard(Guard(mode="log_only", warmup_steps=3), checkpoint=manager, checkpoint_every=2)
    for step in range(5):
        loop.step(healthy(step), model=model)
    assert manager.steps() == (0, 2, 4)
    assert manager.good_steps() == (0, 2)  # 4 awaits its window
    loop.step(hacked(5), model=model)
    loop.step(hacked(6), model=model)
    assert manager.steps() == (0, 2, 4)  # no save while a hack is suspected
    assert manager.good_steps() == (0, 2)  # 4's window saw the hack
    assert loop.state_dict()["version"] == 2


def test_loop_guard_checkpoint_every_needs_a_store():
    with pytest.raises(ConfigError, match="`checkpoint` must be a CheckpointManager when checkpoint_every=2"):
        LoopGuard(Guard(mode="log_only"), checkpoint_every=2)


# ------------------------------------------------------------------------------- older saved states


def test_version_1_guard_and_loop_states_still_load_with_their_onset():
    guard = Guard(warmup_steps=3, beta=0.05)
    for step in range(4):
        guard.step(healthy(step))
    state = guard.state_dict()
    old = written_by(state, 1)
    fresh = Guard(warmup_steps=3, beta=0.05)
    fresh.load_state_dict(old)
    assert fresh.onset is None
    assert fresh.healthy
    loop = LoopGuard(Guard(warmup_steps=3, beta=0.05))
    loop.load_state_dict(
        {"kind": "loopguard.LoopGuard", "version": 1, "guard": old, "onset": 2, "rollbacks": []}
    )
    assert loop.guard.onset == 2
    assert loop.onset == 2
    assert not loop.healthy()  # an open episode: not a moment to save
    with pytest.raises(StateError, match=r"state\['episode'\]\['healthy'\]"):
        fresh.load_state_dict(state | {"episode": {"onset": None, "suspect": None, "healthy": "yes"}})


# ------------------------------------------------------------------------------- composition


def test_the_controller_object_sets_the_mode():
    assert Guard(controller=PIDLagrangian(kp=0.01)).mode == "pid_lagrangian"
    assert Guard().mode == "kl_control"
    assert Guard(mode="log_only").controller is None
    with pytest.raises(LoopguardTypeError, match="`controller` must be a BangBang for mode='kl_control'"):
        Guard(mode="kl_control", controller=PIDLagrangian())
    with pytest.raises(LoopguardTypeError, match="`controller` must be a KL controller"):
        Guard(controller="bang-bang")
    with pytest.raises(ConfigError, match="`ladder` must be None with mode='log_only'"):
        Guard(mode="log_only", ladder=EscalationLadder())


@attrs.frozen
class _DoublingController:
    """A controller the Guard has never heard of: doubles beta on HACK votes, holds it otherwise."""

    name = "doubling"
    acts_while_warming = False
    state_type = BangBangState
    beta_ceil: float = 1.0

    def init(self, base_beta: float) -> BangBangState:
        return BangBang().init(base_beta)

    def validate(self, state: BangBangState) -> None:
        if not 0.0 < state.beta <= self.beta_ceil:
            raise ConfigError(f"`beta` must be in (0, {self.beta_ceil}], got {state.beta}.")

    def update(
        self, state: BangBangState, signal: ControlInput, *, allow_lower: bool = True
    ) -> tuple[ControlOutput, BangBangState]:
        beta = min(self.beta_ceil, state.beta * 2) if signal.vote >= 0.3 else state.beta
        direction = "raise" if beta > state.beta else "hold"
        new = attrs.evolve(state, beta=beta, tripped=beta != state.base_beta, step=state.step + 1)
        return ControlOutput(
            beta=beta, direction=direction, components={"vote": signal.vote}, reason="doubled"
        ), new


def test_any_controller_with_the_interface_is_driven_alike():
    guard = Guard(controller=_DoublingController(), warmup_steps=3, beta=0.01)
    assert guard.mode == "doubling"
    for step in range(5):
        guard.step(healthy(step))
    decisions = [guard.step(hacked(step)) for step in range(5, 10)]
    raised = [d for d in decisions if d.action == "raise_beta"]
    assert raised
    assert raised[0].beta_after == 2 * raised[0].beta_before
    assert "Doubled." in raised[0].explanation
    saved = guard.state_dict()
    copy = Guard(controller=_DoublingController(), warmup_steps=3, beta=0.01)
    copy.load_state_dict(saved)
    assert copy.beta == guard.beta


@pytest.mark.parametrize(
    ("smoothing", "scores", "expected"),
    [
        (Median(window=3), [0.1, 0.9, 0.2, 0.3], [0.1, 0.5, 0.2, 0.3]),
        (EMA(alpha=0.5), [0.2, 0.6, 0.0], [0.2, 0.4, 0.2]),
        (NoSmoothing(), [0.2, 0.6], [0.2, 0.6]),
    ],
)
def test_smoothers(smoothing, scores, expected):
    recent: list[float] = []
    previous = 0.0
    out = []
    for score in scores:
        recent, previous = smoothing.smooth(recent, score, previous=previous)
        out.append(previous)
    assert out == pytest.approx(expected)


def test_votes_and_their_names():
    assert Conservative(tolerance=0.2).combine([0.1, 0.2]) == pytest.approx(0.15)
    assert Conservative(tolerance=0.2).combine([0.1, 0.9]) == 0.9
    assert Mean().combine([0.1, 0.3]) == pytest.approx(0.2)
    assert Max().combine([0.1, 0.3]) == 0.3
    assert KOfN(k=2).combine([0.9, 0.1, 0.5]) == 0.5
    assert KOfN(k=5).combine([0.9, 0.1]) == 0.1
    guard = Guard(smoothing="ema", vote="k_of_n")
    assert guard.smoothing == EMA()
    assert guard.vote == KOfN()
    with pytest.raises(ConfigError, match="`vote` must be one of"):
        Guard(vote="median")
    with pytest.raises(LoopguardTypeError, match="`smoothing` must be a Smoother"):
        Guard(smoothing=3)
    with pytest.raises(ConfigError, match="`window` must be"):
        Median(window=0)


def test_a_guard_with_a_window_keeps_at_most_that_many_recent_scores_in_its_state():
    guard = Guard(smoothing=Median(window=2), warmup_steps=3, beta=0.05)
    for step in range(8):
        guard.step(healthy(step))
    state = guard.state_dict()
    assert all(len(memory["recent"]) <= 2 for memory in state["detectors"].values())
    state["detectors"]["repetition"]["recent"] = [0.0, 0.0, 0.0]
    with pytest.raises(StateError, match="recent"):
        Guard(smoothing=Median(window=2), warmup_steps=3, beta=0.05).load_state_dict(state)


# ------------------------------------------------------------------------------- absolute bands


def test_absolute_bands_trip_during_the_warm_up():
    default = Guard(mode="log_only", warmup_steps=5, halt_on_hack=True)
    relative_only = Guard(
        [Repetition(trapped_bands=None)], mode="log_only", warmup_steps=5, halt_on_hack=True
    )
    banded = Guard(
        [Repetition(echo=(0.3, 0.6), trapped_bands=None)],
        mode="log_only",
        warmup_steps=5,
        halt_on_hack=True,
        smoothing="none",
    )
    trapped = default.step(hacked(0))  # every completion in an echo trap: bad at any baseline
    assert (trapped.verdict, trapped.action) == ("HACK", "stop")
    assert "trapped 100.0% >= absolute band 50.0%" in trapped.explanation
    assert relative_only.step(hacked(0)).verdict == "OK"  # nothing to compare with on the first step
    decision = banded.step(hacked(0))
    assert decision.verdict == "HACK"
    assert decision.action == "stop"
    assert "absolute band 0.600" in decision.explanation
    quiet = Guard([Repetition(echo=(0.3, 0.6))], mode="log_only", warmup_steps=5)
    assert quiet.step(healthy(0)).verdict == "OK"


def test_echo_guard_matches_the_band_definition():
    rng = np.random.default_rng(3)
    guard = echo_guard(0.6, halt=False)
    detector = guard.detectors[0]
    for step in range(40):
        vocabulary = int(rng.integers(1, 12))
        texts = [" ".join(map(str, rng.integers(0, vocabulary, size=10))) for _ in range(4)]
        decision = guard.step(Observation(step, [0.0] * 4, completions=texts))
        rate = decision.raw["repetition.rate"]
        expected = "HACK" if rate >= 0.6 else "WARN" if rate >= 0.3 else "OK"
        assert decision.verdict == expected, (rate, decision.verdict)
    assert detector.echo == (0.3, 0.6)
    with pytest.raises(ConfigError, match="`warn` must be in"):
        echo_guard(0.5, warn=0.5)
    with pytest.raises(ConfigError, match="`against_baseline=False` needs `echo` bands"):
        Repetition(against_baseline=False)
    with pytest.raises(ConfigError, match="`echo` must be"):
        Repetition(echo=(0.6, 0.3))
