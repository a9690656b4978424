"""The sustained-evidence rule (``Guard(cusum=...)``): Page's CUSUM of a primary signal's excess.

The ensemble's disagreement is the controlled statistic: two members that differ by ``delta`` on every
completion disagree by exactly ``delta**2 / 4`` (the population variance of two values). The warm-up and
the step that fixes the baseline cycle through 1.0, 1.1 and 1.2, so the baseline is median 1.1 and MAD 0.1
(noise scale 0.148, 13 % of the median):
the ensemble's own relative bands (WARN at a 0.5 rise, HACK at 1.5) are above the noise floors, and a rise
of ``r`` is ``r / 1.5`` HACK bands.
"""

import json
import math

import numpy as np
import pytest

from loopguard import (
    ConfigError,
    EscalationLadder,
    Guard,
    LoopguardTypeError,
    Observation,
    RMEnsemble,
    StateError,
)

B = 8
WARMUP = 20
MEDIAN = 1.1
HACK_BAND = 1.5  # RMEnsemble's relative HACK band (above 5 noise scales here)


def observation(step, disagreement, length=4):
    delta = 2.0 * math.sqrt(disagreement)
    rewards = np.linspace(0.0, 1.0, B)
    completions = [" ".join(["w"] * length)] * B
    return Observation(step, rewards, ensemble_scores=[rewards, rewards + delta], completions=completions)


def warmed(guard):
    """The warm-up and the first step after it (which fixes the baseline); returns the next step."""
    for step in range(WARMUP + 1):
        decision = guard.step(observation(step, (1.0, 1.1, 1.2)[step % 3]))
        assert decision.verdict == "OK", decision.explanation
    assert guard.state_dict()["detectors"]["rm_ensemble"]["baseline"]["disagreement"] == pytest.approx(
        [MEDIAN, 1.4826 * 0.1]
    )
    return WARMUP + 1


def rise(relative):
    return MEDIAN * (1.0 + relative)


def test_a_rise_below_the_hack_band_trips_after_the_steps_its_cusum_needs():
    # a rise of 1.125 is 0.75 HACK bands: it scores WARN on every step (0.1 + 0.2 * 0.625 = 0.225 < 0.3);
    # less the slack 0.3 it adds 0.45 a step, so the sum reaches the limit 1.2 on the third step, which reads
    # HACK; the rise is then dated (the sum drops to -1.2), and while it stays up it does not trip again
    guard = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0)
    off = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0, cusum=None)
    start = warmed(guard)
    warmed(off)
    verdicts, plain = [], []
    for step in range(start, start + 12):
        verdicts.append(guard.step(observation(step, rise(1.125))))
        plain.append(off.step(observation(step, rise(1.125))).verdict)
    assert [d.verdict for d in verdicts] == ["WARN", "WARN", "HACK"] + ["WARN"] * 9
    assert plain == ["WARN"] * 12  # the rule off: no single step reaches the HACK band
    assert verdicts[2].scores["rm_ensemble"] == pytest.approx(0.30)
    assert verdicts[3].scores["rm_ensemble"] == verdicts[0].scores["rm_ensemble"]  # the per-step score
    text = verdicts[2].explanation
    assert "Sustained rise: rm_ensemble.disagreement over 3 steps" in text
    assert "CUSUM" in text
    assert "Sustained" not in verdicts[3].explanation
    assert guard.state_dict()["detectors"]["rm_ensemble"]["evidence"] == {"disagreement": [-1.2, 0.0]}


def test_a_sustained_hack_that_leaves_beta_where_it_was_says_why():
    # the same rise under kl_control: the dated step reads HACK with its vote at the trip band, one step of
    # the two in a row the controller needs to raise beta, so beta is held; the explanation says so rather
    # than leave a HACK verdict with no action unexplained
    guard = Guard([RMEnsemble(members=2)], mode="kl_control", beta=0.01, reference_steps=0)
    start = warmed(guard)
    decisions = [guard.step(observation(step, rise(1.125))) for step in range(start, start + 4)]
    assert [(d.verdict, d.action) for d in decisions] == [("WARN", "none")] * 2 + [
        ("HACK", "none"),
        ("WARN", "none"),
    ]
    held = decisions[2]
    assert held.beta_after == held.beta_before == 0.01
    assert "Sustained rise: rm_ensemble.disagreement over 3 steps" in held.explanation
    assert held.explanation.endswith("Held beta 0.01: vote 0.30 >= trip 0.3 for 1 of 2 steps needed to trip.")
    assert "Held beta" not in decisions[1].explanation  # a WARN that holds beta needs no reason


def test_a_dated_rise_must_come_back_before_it_trips_again():
    # after the trip the sum sits at -1.2; each step back at the baseline (0 bands) climbs by the slack 0.3,
    # so four of them re-arm the rule, and the same rise is then dated again three steps later
    guard = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0)
    steps = iter(range(warmed(guard), 10_000))

    def feed(disagreement):
        decision = guard.step(observation(next(steps), disagreement))
        return decision.verdict, guard.state_dict()["detectors"]["rm_ensemble"]["evidence"]["disagreement"]

    assert [feed(rise(1.125))[0] for _ in range(3)][-1] == "HACK"
    sums = [feed(MEDIAN)[1] for _ in range(4)]
    assert sums == [pytest.approx([value, 0.0]) for value in (-0.9, -0.6, -0.3, 0.0)]
    # OK first: the median-of-3 smoother still holds two calm steps
    assert [feed(rise(1.125))[0] for _ in range(3)] == ["OK", "WARN", "HACK"]
    # a step partly back (0.15 bands: half the slack) climbs by only 0.15; a step above the slack (0.75
    # bands) pushes the sum back down, never below -1.2
    for relative, expected in ((0.225, -1.05), (1.125, -1.2), (1.125, -1.2), (0.225, -1.05)):
        assert feed(rise(relative))[1] == pytest.approx([expected, 0.0])
    # while armed, a sum above 0 falls back by the slack on each step at the baseline, down to 0
    for _ in range(7):
        feed(MEDIAN)
    assert feed(rise(1.125))[1] == pytest.approx([0.45, 1.0])
    assert feed(MEDIAN)[1] == pytest.approx([0.15, 2.0])
    assert feed(MEDIAN)[1] == [0.0, 0.0]


def test_noise_below_the_slack_never_adds_up():
    # 0.4 rise = 0.27 HACK bands < slack 0.3: however long it lasts, nothing accumulates
    guard = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0)
    start = warmed(guard)
    decisions = [guard.step(observation(step, rise(0.4))) for step in range(start, start + 50)]
    assert {d.verdict for d in decisions} == {"OK"}
    assert guard.state_dict()["detectors"]["rm_ensemble"]["evidence"] == {"disagreement": [0.0, 0.0]}


def test_a_stronger_rise_trips_sooner_and_the_limit_sets_how_soon():
    # 1.35 rise = 0.9 bands: 0.6 a step reaches 1.2 on the second step (two steps, as the median-of-3
    # smoother needs for an instantaneous HACK); a limit of 1.8 needs the third
    for limit, expected in ((1.2, 2), (1.8, 3)):
        guard = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0, cusum=(0.3, limit))
        start = warmed(guard)
        verdicts = [guard.step(observation(step, rise(1.35))).verdict for step in range(start, start + 4)]
        assert verdicts.index("HACK") + 1 == expected


def test_corroborating_signals_keep_no_evidence():
    # length is corroborating: it moves with healthy learning, so its steady rise accumulates nothing
    guard = Guard([RMEnsemble(members=2), "length"], mode="log_only", reference_steps=0)
    for step in range(WARMUP + 1):
        guard.step(observation(step, (1.0, 1.1, 1.2)[step % 3], length=4 + step % 2))
    for step in range(WARMUP + 1, WARMUP + 11):
        guard.step(observation(step, 1.1, length=12))
    memories = guard.state_dict()["detectors"]
    assert memories["length"]["evidence"] == {}
    assert memories["rm_ensemble"]["evidence"] == {"disagreement": [0.0, 0.0]}


def test_the_evidence_resumes_from_a_saved_state_and_a_rollback_clears_it():
    ladder = EscalationLadder(rollback_patience=2, stop_patience=5, max_rollbacks=1, cooldown_steps=1)
    guard = Guard([RMEnsemble(members=2)], beta=0.01, ladder=ladder, reference_steps=0)
    start = warmed(guard)
    guard.step(observation(start, rise(1.125)))
    evidence = guard.state_dict()["detectors"]["rm_ensemble"]["evidence"]["disagreement"]
    assert evidence[0] == pytest.approx(0.45)
    resumed = Guard([RMEnsemble(members=2)], beta=0.01, ladder=ladder, reference_steps=0)
    resumed.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    actions = []
    for step in range(start + 1, start + 10):  # a rise past the HACK band on every step: the ladder acts
        decision, again = guard.step(observation(step, rise(3.0))), resumed.step(observation(step, rise(3.0)))
        mine = (decision.verdict, decision.action, decision.beta_after, decision.explanation)
        assert (again.verdict, again.action, again.beta_after, again.explanation) == mine
        actions.append(decision.action)
        if decision.action == "rollback":
            break
    assert actions[-1] == "rollback"
    assert guard.state_dict()["detectors"]["rm_ensemble"]["evidence"] == {}


def test_a_state_of_version_4_loads_without_evidence():
    guard = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0)
    start = warmed(guard)
    guard.step(observation(start, rise(1.125)))
    old = json.loads(json.dumps(guard.state_dict()))
    old["version"] = 4
    del old["pricing"]  # version 6's
    for memory in old["detectors"].values():
        del memory["evidence"]
    resumed = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0)
    resumed.load_state_dict(old)
    # the rise starts counting again from the resumed step: three more steps to the limit
    verdicts = [resumed.step(observation(step, rise(1.125))).verdict for step in range(start + 1, start + 4)]
    assert verdicts == ["WARN", "WARN", "HACK"]


@pytest.mark.parametrize(
    ("evidence", "message"),
    [
        ({"nope": [0.1, 1.0]}, "must name a statistic of the baseline (['disagreement']), got 'nope'"),
        ({"disagreement": [-0.1, 1.0]}, "and 0 steps when the sum is below 0 (a dated rise)"),
        (
            {"disagreement": [0.5, 1.5]},
            "must be [sum, steps] with a whole number of steps in [0, 22]",
        ),
        ({"disagreement": [0.5, 99.0]}, "a whole number of steps in [0, 22]"),
        ({"disagreement": [0.5, -1.0]}, "a whole number of steps in [0, 22]"),
        ({"disagreement": [0.5]}, "must be [sum, steps]"),
        ({"disagreement": [float("nan"), 1.0]}, "must be finite"),
    ],
)
def test_a_bad_saved_evidence_is_refused_and_names_the_field(evidence, message):
    guard = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0)
    start = warmed(guard)
    guard.step(observation(start, rise(1.125)))
    state = json.loads(json.dumps(guard.state_dict()))
    state["detectors"]["rm_ensemble"]["evidence"] = evidence
    before = guard.state_dict()
    with pytest.raises(StateError, match=r"state\['detectors'\]\['rm_ensemble'\]\['evidence'\]") as caught:
        guard.load_state_dict(state)
    assert message in str(caught.value)
    assert guard.state_dict() == before  # all or nothing


def test_a_saved_sum_above_this_guards_limit_is_taken_at_the_limit():
    guard = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0, cusum=(0.3, 3.0))
    start = warmed(guard)
    for step in range(start, start + 6):
        guard.step(observation(step, rise(1.125)))
    evidence = guard.state_dict()["detectors"]["rm_ensemble"]["evidence"]["disagreement"]
    assert evidence[0] == pytest.approx(2.7)
    lower = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0)
    lower.load_state_dict(guard.state_dict())
    assert lower.state_dict()["detectors"]["rm_ensemble"]["evidence"]["disagreement"][0] == 1.2
    assert lower.step(observation(start + 6, rise(1.125))).verdict == "HACK"  # at its limit: dated at once


def test_a_dated_rise_is_saved_and_a_deeper_one_is_taken_at_this_guards_minus_limit():
    guard = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0, cusum=(0.3, 3.0))
    start = warmed(guard)
    for step in range(start, start + 8):  # 0.45 a step: the sum reaches 3.0 on the seventh step
        decision = guard.step(observation(step, rise(1.125)))
    assert decision.verdict == "WARN"
    assert guard.state_dict()["detectors"]["rm_ensemble"]["evidence"] == {"disagreement": [-3.0, 0.0]}
    lower = Guard([RMEnsemble(members=2)], mode="log_only", reference_steps=0)
    lower.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    assert lower.state_dict()["detectors"]["rm_ensemble"]["evidence"] == {"disagreement": [-1.2, 0.0]}
    # still dated after the resume: the raised level does not trip it again
    verdicts = [lower.step(observation(step, rise(1.125))).verdict for step in range(start + 8, start + 14)]
    assert "HACK" not in verdicts


@pytest.mark.parametrize(
    ("cusum", "error", "message"),
    [
        (
            [0.3, 1.2],
            LoopguardTypeError,
            "`cusum` must be a (slack, limit) pair of HACK-band multiples or None, got [0.3, 1.2].",
        ),
        ((0.3,), LoopguardTypeError, "`cusum` must be a (slack, limit) pair"),
        ((0.0, 1.2), ConfigError, "`cusum[0]` must be"),
        ((1.0, 1.2), ConfigError, "`cusum[0]` must be"),
        ((0.3, float("inf")), ConfigError, "`cusum[1]` must be finite"),
        (
            (0.3, 0.7),
            ConfigError,
            "`cusum` must have limit > 1 - slack (0.7): one step alone must not trip it, got (0.3, 0.7).",
        ),
    ],
)
def test_a_bad_cusum_is_refused_at_construction(cusum, error, message):
    with pytest.raises(error) as caught:
        Guard([RMEnsemble(members=2)], mode="log_only", cusum=cusum)
    assert message in str(caught.value)
