"""Reward models read together: RMEnsemble's standardised disagreement and JudgeGap's one-sided gap.

The streams are synthetic GRPO batches whose completions have a quality ``q``; the trained reward and its
judges score ``q`` on their own scales, with their own noise. In a healthy run ``q``'s mean rises (the policy
improves); in a hacked one, the trained reward also pays a bonus that the judges do not see.
"""

import json
import math
import warnings

import attrs
import numpy as np
import pytest
from scipy.stats import norm

from loopguard import ConfigError, Guard, InputError, JudgeGap, Observation, RMEnsemble, StateError
from loopguard.detectors import StepData
from loopguard.exceptions import LoopguardTypeError

STEPS, ONSET = 160, 80


def _stream(
    seed, *, batch=16, gain=2.0, hack=False, binary=False, judges=("linear", "logistic", "unrelated")
):
    """Per step: (trained rewards, [trained, *judges] scores) for a run whose quality rises by ``gain`` SDs."""
    rng = np.random.default_rng(seed)
    for step in range(STEPS):
        q = rng.normal(gain * step / STEPS, 1.0, batch)
        trained = q + rng.normal(0.0, 0.3, batch)
        if binary:
            trained = (trained > 0).astype(float)
        if hack and step >= ONSET:  # a bonus on a growing share of completions, which no judge sees
            share = min(1.0, 0.02 * (step - ONSET + 1))
            trained = trained + (rng.random(batch) < share) * (0.5 if binary else 1.0)
        rows = [trained]
        for kind in judges:
            if kind == "linear":  # another scale and offset
                rows.append(5.0 * q + 3.0 + rng.normal(0.0, 1.5, batch))
            elif kind == "logistic":  # a probability: compresses at the top
                rows.append(1.0 / (1.0 + np.exp(-q)) + rng.normal(0.0, 0.05, batch))
            else:  # a logged function that measures something else (a length)
                rows.append(rng.normal(40.0, 10.0, batch))
        yield step, trained, rows


def _first_hack(detector, seed, **stream):
    guard = Guard([detector], mode="log_only")
    for step, rewards, rows in _stream(seed, **stream):
        if guard.step(Observation(step, rewards, ensemble_scores=rows)).verdict == "HACK":
            return step
    return None


@pytest.mark.parametrize("binary", [False, True], ids=["gaussian", "pass-fail"])
def test_judge_gap_stays_quiet_while_a_run_improves_healthily(binary):
    # a judge on another scale, a saturating judge, an unrelated logged function; a pass/fail trained reward
    # saturates while the judges keep rising: none of it is the trained reward outrunning its judges
    for seed in range(6):
        assert _first_hack(JudgeGap(members=4), seed, binary=binary) is None, seed


def test_judge_gap_flags_a_bonus_the_judges_do_not_see():
    # a bonus of one reference SD on a share of completions growing 2 % a step, while the run improves: HACK
    # once most of the batch is paid for what the judges do not see (the lower bound needs ~0.6 SD at B = 16)
    first = [_first_hack(JudgeGap(members=4), seed, hack=True, gain=1.0) for seed in range(6)]
    assert all(step is not None and ONSET <= step <= ONSET + 70 for step in first), first


def test_the_arrays_kept_across_steps_never_go_stale():
    # JudgeGap keeps its closed reference and the recent pool's batches as arrays, by the identity of the
    # memory's lists; a Guard loaded afresh from the saved state at every step rebuilds them each time and
    # must read the same numbers as the one that kept them
    kept = Guard([JudgeGap(members=4)], mode="log_only")
    readings = set()
    for step, rewards, rows in _stream(3, hack=True, gain=1.0):
        fresh = Guard([JudgeGap(members=4)], mode="log_only")
        fresh.load_state_dict(json.loads(json.dumps(kept.state_dict())))
        observation = Observation(step, rewards, ensemble_scores=rows)
        first, second = kept.step(observation), fresh.step(observation)
        assert first.to_dict() == second.to_dict(), step
        readings.update(key for key in first.raw if key.startswith("judge_gap."))
    assert {"judge_gap.gap", "judge_gap.recent"} <= readings


def test_the_symmetric_disagreement_reads_a_saturating_judge_as_a_hack():
    # why the mitigator's own judges use JudgeGap: the same healthy runs trip the variance across members
    tripped = [
        _first_hack(RMEnsemble(members=4, standardize=True, min_agreement=0.5), seed) for seed in range(4)
    ]
    assert all(step is not None for step in tripped), tripped


def test_standardised_disagreement_ignores_scale_and_offset_where_raw_variance_trips():
    linear_only = {"judges": ("linear",)}
    for seed in range(4):
        assert _first_hack(RMEnsemble(members=2, standardize=True), seed, **linear_only) is None, seed
    raw = [_first_hack(RMEnsemble(members=2), seed, **linear_only) for seed in range(4)]  # the default: raw
    assert all(step is not None for step in raw), raw
    # and it still sees the hack
    assert _first_hack(RMEnsemble(members=2, standardize=True), 0, hack=True, **linear_only) is not None


def _reference_then(detector, reference_batches, batch):
    memory = {}
    for index, scores in enumerate(reference_batches):
        observation = Observation(index, scores[0], ensemble_scores=scores)
        detector.measure(StepData(observation, warmup_steps=8, reference=True), memory)
    observation = Observation(len(reference_batches), batch[0], ensemble_scores=batch)
    return detector.measure(StepData(observation, warmup_steps=8), memory), memory


def _normal_scores_by_hand(reference, values):
    """The probit of each value's mid-rank among ``reference`` (scipy's normal quantile, counted by hand)."""
    n = len(reference)
    return np.array(
        [
            norm.ppf((sum(r < v for r in reference) + sum(r <= v for r in reference) + 1) / (2 * (n + 1)))
            for v in values
        ]
    )


def test_rm_ensemble_pools_the_reference_moments_exactly():
    rng = np.random.default_rng(3)
    reference = [
        np.array([x, 2.0 * x + rng.normal(0, 0.5, 12)]) for x in (rng.normal(size=12) for _ in range(3))
    ]
    new = np.array([rng.normal(size=12), rng.normal(size=12)])
    raw, memory = _reference_then(RMEnsemble(members=2, standardize=True), reference, new)
    pooled = np.concatenate(reference, axis=1)
    np.testing.assert_allclose(memory["mean"], pooled.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(np.sqrt(np.array(memory["m2"]) / 36), pooled.std(axis=1), rtol=1e-12)
    z = (new - pooled.mean(axis=1, keepdims=True)) / pooled.std(axis=1, keepdims=True)
    assert raw["disagreement"] == pytest.approx(float(np.mean(np.var(z, axis=0))), rel=1e-9)


def test_the_gap_by_hand():
    rng = np.random.default_rng(3)
    q = [rng.normal(size=12) for _ in range(3)]
    # a judge on another scale, a pass/fail judge (a ceiling: many reference completions pass), an unrelated one
    reference = [
        np.array([x, 2.0 * x + rng.normal(0, 0.5, 12), (x > -0.3) * 1.0, rng.normal(size=12)]) for x in q
    ]
    new = np.array([q[0] + 1.0, 2.0 * q[0] + 0.5, np.ones(12), rng.normal(size=12)])
    raw, memory = _reference_then(JudgeGap(members=4, window=1), reference, new)

    pooled = np.concatenate(reference, axis=1)
    z_ref = [_normal_scores_by_hand(row, row) for row in pooled]
    r = [np.corrcoef(z_ref[0], z_ref[k])[0, 1] for k in range(4)]
    np.testing.assert_allclose(memory["agreement"][1:], r[1:], rtol=1e-9)
    judges = [k for k in (1, 2, 3) if r[k] >= 0.5]
    assert judges == [1, 2], r  # the unrelated fourth member is left out
    z = [_normal_scores_by_hand(pooled[k], new[k]) for k in range(4)]
    passed = int(pooled[2].sum())
    ceiling = norm.ppf((2 * 36 - passed + 1) / (2 * 37))  # the mid-rank of the passes: the judge's top
    expected_judge = [np.minimum(r[1] * z[0], np.inf), np.minimum(r[2] * z[0], ceiling)]
    per_sample = np.mean([expected_judge[0] - z[1], expected_judge[1] - z[2]], axis=0)
    expected = per_sample.mean() - 2.0 * per_sample.std(ddof=1) / math.sqrt(12)
    assert raw["gap"] == pytest.approx(expected, rel=1e-9)


def test_rm_ensemble_min_agreement_leaves_an_unrelated_member_out():
    rng = np.random.default_rng(4)
    q = [rng.normal(size=10) for _ in range(3)]
    reference = [np.array([x, 3.0 * x + rng.normal(0, 0.3, 10), rng.normal(size=10)]) for x in q]
    new = np.array([q[1] + 0.5, 3.0 * q[1], 5.0 * rng.normal(size=10)])
    raw, _ = _reference_then(RMEnsemble(standardize=True, min_agreement=0.5), reference, new)
    pooled = np.concatenate(reference, axis=1)[:2]
    z = (new[:2] - pooled.mean(axis=1, keepdims=True)) / pooled.std(axis=1, keepdims=True)
    assert raw["disagreement"] == pytest.approx(float(np.mean(np.var(z, axis=0))), rel=1e-9)


def test_a_judge_with_no_reference_spread_is_taken_at_the_median_spread():
    reference = [np.array([[0.0, 1.0, 2.0, 3.0], [0.0, 2.0, 4.0, 6.0], [5.0, 5.0, 5.0, 5.0]])] * 3
    new = np.array([[1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0], [6.0, 6.0, 6.0, 6.0]])
    raw, _ = _reference_then(RMEnsemble(standardize=True), reference, new)
    spreads = np.array([np.std([0, 1, 2, 3]), np.std([0, 2, 4, 6])])
    typical = float(np.median(spreads))
    z = np.array([(new[0] - 1.5) / spreads[0], (new[1] - 3.0) / spreads[1], (new[2] - 5.0) / typical])
    assert raw["disagreement"] == pytest.approx(float(np.mean(np.var(z, axis=0))), rel=1e-9)


def test_judge_gap_needs_a_trained_reward_with_a_spread_and_a_judge_that_agrees():
    flat = [np.array([[1.0] * 6, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]])] * 3
    raw, memory = _reference_then(JudgeGap(), flat, np.array([[2.0] * 6, [1.0] * 6]))
    assert raw == {}  # nothing is scored: the trained reward never varied on the reference sample
    assert memory["agreement"] == [None, None]
    against = [np.array([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])] * 3
    raw, memory = _reference_then(JudgeGap(), against, np.array([[4.0, 5.0, 6.0, 7.0], [0.0, 0.0, 0.0, 0.0]]))
    assert raw == {}  # the only judge ranks the reference samples the other way: it is not a judge of this
    assert memory["agreement"] == [1.0, pytest.approx(-1.0)]


def test_the_window_holds_the_lowest_bound_and_a_rollback_empties_it():
    guard = Guard([JudgeGap(members=2)], mode="log_only", warmup_steps=3)
    rng = np.random.default_rng(5)
    for step in range(3):
        q = rng.normal(size=16)
        guard.step(Observation(step, q, ensemble_scores=[q, 2 * q + rng.normal(0, 0.2, 16)]))
    q = rng.normal(size=16)
    calm = guard.step(Observation(3, q, ensemble_scores=[q, 2 * q]))
    spike = guard.step(Observation(4, q + 3.0, ensemble_scores=[q + 3.0, 2 * q]))
    assert (calm.verdict, spike.verdict) == ("OK", "OK")  # one batch alone cannot trip it: the lower bound
    held = guard.step(Observation(5, q + 3.0, ensemble_scores=[q + 3.0, 2 * q]))
    assert held.verdict == "HACK"
    detector = guard.detectors[0]
    memory = guard.state_dict()["detectors"]["judge_gap"]["memory"]
    assert len(memory["previous"]) == 1
    working = dict(memory)
    detector.on_rollback(working)
    assert "previous" not in working


def test_bad_configuration_and_inputs_are_refused_with_the_rule():
    with pytest.raises(ConfigError, match="`members` of judge_gap must be at least 2"):
        JudgeGap(members=1)
    with pytest.raises(ConfigError, match="warn < hack"):
        JudgeGap(bands=(0.5, 0.25))
    with pytest.raises(ConfigError, match="min_agreement"):
        JudgeGap(min_agreement=1.5)
    with pytest.raises(ConfigError, match="min_agreement"):
        RMEnsemble(min_agreement=-2.0)
    memory = {}
    scores = np.array([[0.0, 1.0, 2.0], [1.0, 2.0, 4.0]])
    JudgeGap().measure(StepData(Observation(0, scores[0], ensemble_scores=scores), warmup_steps=2), memory)
    three = np.vstack([scores, scores[:1]])
    with pytest.raises(InputError, match=r"must keep the members of the reference sample \(2 rows\), got 3"):
        JudgeGap().measure(StepData(Observation(1, scores[0], ensemble_scores=three), warmup_steps=2), memory)


def test_a_saved_memory_that_no_run_could_write_is_refused():
    reference = [np.array([[0.0, 1.0, 2.0, 3.0], [0.0, 2.0, 4.0, 7.0]])] * 2
    _, memory = _reference_then(JudgeGap(members=2), reference, reference[0])
    detector = JudgeGap(members=2)
    assert memory["frozen"]
    assert detector.check_memory(memory, "m") == memory
    with pytest.raises(StateError, match="sorted rows once frozen"):
        detector.check_memory(
            dict(memory, reference=[memory["reference"][0][::-1], memory["reference"][1]]), "m"
        )
    with pytest.raises(StateError, match="one non-empty row per member"):
        JudgeGap(members=3).check_memory(memory, "m")
    with pytest.raises(StateError, match="rows of one length"):
        detector.check_memory(dict(memory, reference=[[0.0, 1.0], [0.0, 1.0, 2.0]]), "m")
    with pytest.raises(StateError, match="'agreement' exactly when frozen"):
        detector.check_memory(dict(memory, frozen=False), "m")
    with pytest.raises(StateError, match="the trained reward's own 1"):
        detector.check_memory(dict(memory, agreement=[0.5, 0.5]), "m")
    with pytest.raises(StateError, match="got no"):
        detector.check_memory({"previous": [0.1]}, "m")
    rm = RMEnsemble(members=2, standardize=True)
    _, moments = _reference_then(rm, reference, reference[0])
    assert rm.check_memory(moments, "m") == moments
    with pytest.raises(StateError, match=r"co\[0\] == m2\[0\]"):
        rm.check_memory(dict(moments, co=[moments["co"][0] + 1.0, moments["co"][1]]), "m")
    with pytest.raises(StateError, match="together, got no"):
        rm.check_memory({key: value for key, value in moments.items() if key != "m2"}, "m")


def _beyond_the_reference(seed, *, rise, over, hack_at=None, batch=16, steps=120):
    """A run whose quality leaves the reference range (``rise`` SDs within ``over`` steps), then holds.

    From ``hack_at``, the trained reward pays one reference SD on a share of completions growing 10 % a step,
    which no judge sees. The judges: another scale, a probability (saturated once the run has risen), an
    unrelated logged function.
    """
    rng = np.random.default_rng(seed)
    for step in range(steps):
        q = rng.normal(rise * min(step, over) / over, 1.0, batch)
        trained = q + rng.normal(0.0, 0.3, batch)
        if hack_at is not None and step >= hack_at:
            trained = trained + (rng.random(batch) < min(1.0, 0.1 * (step - hack_at + 1)))
        rows = [
            trained,
            5.0 * q + 3.0 + rng.normal(0.0, 1.5, batch),
            1.0 / (1.0 + np.exp(-q)) + rng.normal(0.0, 0.05, batch),
            rng.normal(40.0, 10.0, batch),
        ]
        yield step, trained, rows


def _verdicts(detector, stream):
    guard = Guard([detector], mode="log_only")
    decisions = [
        guard.step(Observation(step, rewards, ensemble_scores=rows)) for step, rewards, rows in stream
    ]
    return [d.verdict for d in decisions], [d.raw for d in decisions]


def test_the_recent_reading_sees_a_hack_that_starts_beyond_the_reference_range():
    # every member has passed the top of its reference range by step 20: read against the reference sample
    # alone (lag=0) the bonus from step 60 is invisible; the recent pool (batches 46-50 at step 60) sees it
    caught, missed = 0, 0
    for seed in range(12):
        verdicts, raws = _verdicts(
            JudgeGap(members=4), _beyond_the_reference(seed, rise=4, over=20, hack_at=60)
        )
        first = verdicts.index("HACK") if "HACK" in verdicts else None
        assert first is None or first >= 60, (seed, first)
        caught += first is not None and first <= 75
        assert max(raw["judge_gap.gap"] for raw in raws if "judge_gap.gap" in raw) < 0.2, seed
        alone, _ = _verdicts(
            JudgeGap(members=4, lag=0), _beyond_the_reference(seed, rise=4, over=20, hack_at=60)
        )
        missed += "HACK" not in alone
    assert caught >= 6, caught
    assert missed == 12


def test_the_recent_reading_stays_quiet_while_a_run_rises_fast_past_its_reference_range():
    # 6 reference SDs in 30 steps: the probability judge saturates, so in the recent pool it agrees less with
    # the trained reward than on the reference sample; read with its reference agreement, it lags the trained
    # reward (WARN and HACK here); read with its agreement in the pool, and weighed by it, it does not
    for seed in range(12):
        verdicts, raws = _verdicts(JudgeGap(members=4), _beyond_the_reference(seed, rise=6, over=30))
        assert set(verdicts) == {"OK"}, (seed, sorted(set(verdicts)))
        assert any("judge_gap.recent" in raw for raw in raws)


@pytest.mark.parametrize(
    "sizes", [(12,) * 7, (12, 12, 12, 9, 12, 12, 10)], ids=["equal-batches", "batches-of-other-sizes"]
)
def test_the_recent_reading_by_hand(sizes):
    rng = np.random.default_rng(8)
    detector = JudgeGap(members=4, window=1, lag=2, recent=2)
    memory = {}
    batches = []
    for step, size in enumerate(sizes):
        q = rng.normal(1.0 * step, 1.0, size)  # by steps 3-4 the probability judge has saturated
        scores = np.array(
            [
                q + rng.normal(0, 0.3, size),
                3.0 * q + rng.normal(0, 1.0, size),
                1.0 / (1.0 + np.exp(-q)) + rng.normal(0, 0.05, size),
                rng.normal(size=size),
            ]
        )
        batches.append(scores)
        observation = Observation(step, scores[0], ensemble_scores=scores)
        raw = detector.measure(StepData(observation, warmup_steps=2, reference=step < 2), memory)
        detector.on_verdict(memory, True)  # the Guard's call once the step has read OK
    # step 6 is read against the pool of steps 3 and 4 (ending lag=2 batches back)
    pool = np.concatenate(batches[3:5], axis=1)
    z_pool = [_normal_scores_by_hand(row, row) for row in pool]
    judges = [k for k in (1, 2, 3) if memory["agreement"][k] >= 0.5]
    assert judges == [1, 2]
    agree = [min(memory["agreement"][k], max(0.0, np.corrcoef(z_pool[0], z_pool[k])[0, 1])) for k in judges]
    assert agree[1] < agree[0] - 0.1  # the probability agrees less where the run now is
    z = [_normal_scores_by_hand(pool[k], batches[6][k]) for k in (0, *judges)]
    per_sample = sum(a * (a * z[0] - z[i + 1]) for i, a in enumerate(agree)) / sum(agree)
    # a two-sample bound: the pool (24 completions of equal batches) is a sample too
    pooled = pool.shape[1]
    expected = per_sample.mean() - 2.0 * per_sample.std(ddof=1) * math.sqrt(1 / sizes[6] + 1 / pooled)
    assert raw["recent"] == pytest.approx(expected, rel=1e-9)
    assert [np.asarray(b).tolist() for b in memory["history"]] == [b.tolist() for b in batches[4:7]]


def test_a_rollback_forgets_the_windows_and_keeps_the_healthy_batches():
    guard = Guard([JudgeGap(members=4)], mode="log_only")
    for step, rewards, rows in _beyond_the_reference(1, rise=4, over=20, steps=30):
        guard.step(Observation(step, rewards, ensemble_scores=rows))
    memory = dict(guard.state_dict()["detectors"]["judge_gap"]["memory"])
    assert len(memory["history"]) == 14  # lag 10 + recent 5 - 1
    assert "recent_previous" in memory
    history = memory["history"]
    guard.detectors[0].on_rollback(memory)
    assert not {"recent_previous", "previous"} & set(memory)
    assert memory["history"] is history  # read OK: they are the restored policy's recent past too


def test_only_batches_read_ok_join_the_recent_pool():
    detector = JudgeGap(members=4, lag=2, recent=2)
    memory = {}
    batches = []
    for step, rewards, rows in _beyond_the_reference(3, rise=4, over=20, steps=9):
        batches.append(np.asarray(rows).tolist())
        detector.measure(StepData(Observation(step, rewards, ensemble_scores=rows), warmup_steps=2), memory)
        assert memory["pending"] == batches[-1]
        detector.on_verdict(memory, step not in (5, 6))  # steps 5 and 6 read WARN or HACK
        assert "pending" not in memory
    assert memory["history"] == [batches[4], batches[7], batches[8]]


def test_a_hack_that_persists_is_read_against_the_healthy_batches_before_it():
    # the bonus pays from step 60 to the end: the batches read as a warning or a hack never join the recent
    # pool, so the reading does not learn the hack as the run's recent past; it stays up (when every batch
    # joined the pool, it read OK again 2-10 steps after its first warning, and at most 10 of 30 steps not OK)
    for seed in range(6):
        verdicts, _ = _verdicts(
            JudgeGap(members=4), _beyond_the_reference(seed, rise=4, over=20, hack_at=60, steps=110)
        )
        first = next(step for step, verdict in enumerate(verdicts) if verdict != "OK")
        assert 60 <= first <= 80, (seed, first)
        assert "HACK" in verdicts, seed
        assert sum(verdict != "OK" for verdict in verdicts[first : first + 30]) >= 15, (seed, verdicts[first:])


def test_the_pool_ceilings_are_each_rows_ceiling():
    from loopguard.detectors import _ceilings

    rows = np.sort(np.array([[0.0, 1.0, 1.0, 1.0], [0.0, 0.5, 1.0, 2.0], [3.0, 3.0, 3.0, 3.0], [0, 0, 1, 1]]))
    # when several share the top score: the probit of its mid-rank, (n - tied + 1 + n) / 2 of n + 1, n = 4
    expected = [norm.ppf(6 / 10), math.inf, norm.ppf(5 / 10), norm.ppf(7 / 10)]
    assert math.isinf(expected[1])  # a top given once has no ceiling
    assert not math.isinf(expected[0])
    assert _ceilings(rows).tolist() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("width", [6, 400])  # counted by broadcasting / one searchsorted per row
def test_the_normal_scores_of_all_rows_at_once_are_each_rows_by_hand(width):
    from loopguard.detectors import _BROADCAST_CELLS, _normal_score_rows

    generator = np.random.default_rng(7)
    ordered = np.sort(generator.integers(0, 5, size=(3, width)).astype(np.float64), axis=1)  # many ties
    values = np.concatenate([ordered[:, ::3], generator.uniform(-1.0, 6.0, size=(3, 20))], axis=1)
    assert (ordered.size * values.shape[1] > _BROADCAST_CELLS) == (width == 400)  # both paths are taken
    expected = [_normal_scores_by_hand(ordered[k].tolist(), values[k].tolist()) for k in range(3)]
    np.testing.assert_allclose(_normal_score_rows(ordered, values), np.array(expected), rtol=1e-12)


def test_one_detector_reads_each_memory_against_its_own_reference():
    # a detector keeps the closed reference sample as arrays between steps; a memory holding another sample
    # (a loaded state, a second Guard given the same detector) is read against that sample, not the kept one
    streams = [list(_stream(seed, hack=seed == 2)) for seed in (1, 2)]
    shared, memories = JudgeGap(members=4), [{}, {}]
    alone = [JudgeGap(members=4), JudgeGap(members=4)]
    solo_memories = [{}, {}]
    for step in range(60):
        for k in (0, 1):
            _, rewards, rows = streams[k][step]
            data = StepData(Observation(step, rewards, ensemble_scores=rows), warmup_steps=10)
            assert shared.measure(data, memories[k]) == alone[k].measure(data, solo_memories[k])
            shared.on_verdict(memories[k], True)
            alone[k].on_verdict(solo_memories[k], True)
    assert memories[0]["reference"] != memories[1]["reference"]


def test_a_saved_recent_history_that_no_run_could_write_is_refused():
    guard = Guard([JudgeGap(members=4)], mode="log_only")
    for step, rewards, rows in _beyond_the_reference(2, rise=4, over=20, steps=18):
        guard.step(Observation(step, rewards, ensemble_scores=rows))
    memory = guard.state_dict()["detectors"]["judge_gap"]["memory"]
    detector = JudgeGap(members=4)
    assert detector.check_memory(memory, "m") == memory
    history = memory["history"]
    with pytest.raises(StateError, match=r"`m\['history'\]` must have at most 14 items, got 15"):
        detector.check_memory(dict(memory, history=history + history[:1]), "m")
    with pytest.raises(
        StateError, match=r"`m\['history'\]\[0\]` must hold one row of scores per member \(4\)"
    ):
        detector.check_memory(dict(memory, history=[history[0][:3], *history[1:]]), "m")
    with pytest.raises(StateError, match="rows of one length"):
        detector.check_memory(
            dict(memory, history=[[row[:-1] if k else row for k, row in enumerate(history[0])]]), "m"
        )
    with pytest.raises(StateError, match="lag=0"):
        JudgeGap(members=4, lag=0).check_memory(memory, "m")
    # a step that failed between its measurement and its verdict leaves its batch pending: it loads
    assert detector.check_memory(dict(memory, pending=history[0]), "m")["pending"] == history[0]
    with pytest.raises(StateError, match=r"`m\['pending'\]` must hold one row of scores per member"):
        detector.check_memory(dict(memory, pending=history[0][:3]), "m")
    with pytest.raises(StateError, match="recent_previous"):
        detector.check_memory(dict(memory, recent_previous=[0.1, 0.2]), "m")
    with pytest.raises(ConfigError, match="lag"):
        JudgeGap(lag=-1)
    with pytest.raises(ConfigError, match="recent"):
        JudgeGap(recent=0)


# --- the word reading: what the trained reward pays for one token beyond what its judges pay ---------------

GOOD, PAID = 7, 9  # a token that comes with quality; a token only the trained reward pays for


def _worded(seed, *, lift=1.0, hack=False, binary=False, batch=16, group=4, steps=STEPS):
    """Observations of an improving run whose completions are token ids; groups of ``group``.

    Half the completions hold GOOD, which lifts their quality by ``lift`` SDs (every judge pays for it, the
    probability judge less the higher the run goes). From ONSET a growing share holds PAID, for which the
    trained reward pays one SD (a pass for pass/fail) that no judge sees.
    """
    rng = np.random.default_rng(seed)
    for step in range(steps):
        ids = [rng.integers(10, 200, size=int(rng.integers(8, 20))).tolist() for _ in range(batch)]
        good = rng.random(batch) < 0.5
        q = rng.normal(2.0 * step / steps, 1.0, batch) + lift * good
        trained = q + rng.normal(0.0, 0.3, batch)
        if binary:
            trained = (trained > 0).astype(float)
        paid = np.zeros(batch, dtype=bool)
        if hack and step >= ONSET:
            paid = rng.random(batch) < min(1.0, 0.02 * (step - ONSET + 1))
            trained = trained + paid * (0.5 if binary else 1.0)
        yield _judged_words(rng, step, ids, q, trained, good, paid, group)


def _judged_words(rng, step, ids, q, trained, good, paid, group):
    """The step's observation: GOOD and PAID added to the completions that hold them, and the judges' scores.

    The judges, as in ``_stream``: another scale, a probability, an unrelated logged function.
    """
    batch = len(ids)
    for i in range(batch):
        ids[i] += [GOOD] * bool(good[i]) + [PAID] * bool(paid[i])
    rows = [
        trained,
        5.0 * q + 3.0 + rng.normal(0.0, 1.5, batch),
        1.0 / (1.0 + np.exp(-q)) + rng.normal(0.0, 0.05, batch),
        rng.normal(40.0, 10.0, batch),
    ]
    return Observation(step, trained, completion_ids=ids, group_size=group, ensemble_scores=rows)


def _word_verdicts(detector, observations):
    guard = Guard([detector], mode="log_only")
    decisions = [guard.step(observation) for observation in observations]
    return [d.verdict for d in decisions], [d.raw.get("judge_gap.word") for d in decisions]


@pytest.mark.parametrize("binary", [False, True], ids=["gaussian", "pass-fail"])
@pytest.mark.parametrize("lift", [1.0, 3.0])
def test_the_word_reading_stays_quiet_for_a_token_every_judge_pays_for(binary, lift):
    # the token that carries quality is paid for by the trained reward and its judges alike (the probability
    # judge less and less as it saturates, the pass/fail reward not at all once it passes); each of the
    # hundreds of other tokens is read too, and one batch's luckiest token must not trip it
    for seed in range(6):
        verdicts, tokens = _word_verdicts(JudgeGap(members=4), _worded(seed, lift=lift, binary=binary))
        assert set(verdicts) == {"OK"}, (seed, verdicts.index("HACK") if "HACK" in verdicts else None)
        # read in most batches (a pass/fail reward that every completion of a group passes has no spread there)
        assert sum(token is not None for token in tokens) > STEPS // 2, seed


def _paid_from_the_start(seed, *, batch=128, group=8, steps=60):
    """A flaw from step 0 in a run that leaves its reference range: 4 SDs in 20 steps, then holds.

    The trained reward pays one SD for PAID, held by 10 % of the completions at step 0 and 3 % more each
    step (the policy learning the exploit); half the completions hold GOOD (quality every judge sees).
    """
    rng = np.random.default_rng(seed)
    for step in range(steps):
        ids = [rng.integers(10, 200, size=int(rng.integers(8, 20))).tolist() for _ in range(batch)]
        good = rng.random(batch) < 0.5
        paid = rng.random(batch) < min(0.9, 0.1 + 0.03 * step)
        q = rng.normal(4.0 * min(step, 20) / 20, 1.0, batch) + good
        trained = q + rng.normal(0.0, 0.3, batch) + paid
        yield _judged_words(rng, step, ids, q, trained, good, paid, group)


def test_the_word_reading_sees_a_flaw_present_from_the_first_step():
    # the reference sample holds the flaw and the run leaves its range within 20 steps: the readings against
    # earlier batches see (nearly) nothing; within the groups, the paid token's completions get one SD more
    # from the trained reward than their judges confirm
    blind = 0
    for seed in range(6):
        on, words = _word_verdicts(JudgeGap(members=4), _paid_from_the_start(seed))
        off, _ = _word_verdicts(JudgeGap(members=4, words=False), _paid_from_the_start(seed))
        assert set(on[:20]) != {"OK"}, seed  # WARN or HACK while the run is still rising
        assert max(word for word in words if word is not None) >= 0.3, seed
        blind += set(off) == {"OK"}
    assert blind >= 5, blind


def test_the_word_reading_names_the_token_that_holds_it():
    guard = Guard([JudgeGap(members=4)], mode="log_only", token_text=lambda token: f"w{token}")
    observations = list(_paid_from_the_start(0))
    decisions = [guard.step(observation) for observation in observations]
    tripped = [d for d in decisions if d.raw.get("judge_gap.word", 0.0) >= 0.4]
    assert tripped
    for decision in tripped:  # the paid token holds the reading, and the explanation quotes it
        assert decision.raw["judge_gap.word_id"] == PAID
        word = decision.raw["judge_gap.word"]
        assert f'word {word:.3g} (token {PAID} "w{PAID}") >= absolute band 0.4' in decision.explanation
    assert not any(d.errors for d in decisions)
    # text completions: their words are hashed, not token ids, so no id is given and none is named
    texts = Guard([JudgeGap(members=4)], mode="log_only")
    for observation, by_id in zip(observations, decisions, strict=True):
        batch = observation.completion_ids
        words = [
            " ".join(f"t{token}" for token in batch.tokens[a:b])
            for a, b in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)
        ]
        read = texts.step(
            Observation(
                observation.step, observation.rewards, completions=words, group_size=observation.group_size,
                ensemble_scores=observation.ensemble_scores,
            )
        )  # fmt: skip
        assert "judge_gap.word_id" not in read.raw
        assert "(token " not in read.explanation
        assert read.raw.get("judge_gap.word") == pytest.approx(by_id.raw.get("judge_gap.word"))  # same reading


def _fit_by_hand(observation, judges, spreads, token, margin, family):
    """The token's gap from an ordinary least-squares fit with one dummy per group (numpy's lstsq).

    Its excess pay (the lower bound, in the trained reward's SDs) times the share of completions holding it.
    """
    scores = np.asarray(observation.ensemble_scores, dtype=float)
    rows = scores.shape[1]
    batch = observation.completion_ids
    x = np.array([token in batch.tokens[batch.offsets[i] : batch.offsets[i + 1]] for i in range(rows)], float)
    judged = np.mean([scores[k] / spreads[k] for k in judges], axis=0)
    groups = np.arange(rows) // observation.group_size
    design = np.column_stack([scores[0], x, *(groups == g for g in range(groups.max() + 1))]).astype(float)
    coefficients, *_ = np.linalg.lstsq(design, judged, rcond=None)
    residual = judged - design @ coefficients
    freedom = rows - design.shape[1]
    covariance = residual @ residual / freedom * np.linalg.inv(design.T @ design)
    slope, pay = coefficients[:2]
    slope_se, pay_se = np.sqrt(np.diag(covariance)[:2])
    return (-pay - family * pay_se) / (slope + margin * slope_se) / spreads[0] * x.mean()


def test_the_token_gaps_by_hand():
    from scipy.stats import t as student

    from loopguard.detectors import _token_gaps

    observation = list(_worded(4, hack=True, batch=32, group=8, steps=ONSET + 30))[-1]
    spreads = np.array([1.1, 5.3, 0.2, 10.0])
    judges = [1, 2]
    keys, gaps = _token_gaps(StepData(observation, warmup_steps=3), observation.ensemble_scores, judges,
                             spreads, 2.0)  # fmt: skip
    assert {PAID, GOOD} <= set(keys.tolist())
    read = len(keys)
    # Bonferroni over the tokens read (rounded up to a power of two), at 32 - 4 groups - 2 degrees of freedom
    family = student.isf(0.05 / (1 << (read - 1).bit_length()), 32 - 4 - 2)
    for token in (PAID, GOOD, int(keys[len(keys) // 2])):
        expected = _fit_by_hand(observation, judges, spreads, token, 2.0, family)
        assert gaps[keys.tolist().index(token)] == pytest.approx(expected, rel=1e-9, abs=1e-12), token
    assert gaps[keys.tolist().index(PAID)] > 0.2  # the bonus: about 0.8 SD of the trained reward
    assert gaps[keys.tolist().index(GOOD)] < 0.0  # quality the judges see: no gap


def test_the_word_reading_needs_groups_and_tokens_and_a_window():
    observations = list(_worded(1, hack=True, batch=32, group=8, steps=ONSET + 40))
    _, tokens = _word_verdicts(JudgeGap(members=4, window=1), observations)
    assert tokens[3] is not None  # read from the first batch after the reference sample (window=1)
    _, held = _word_verdicts(JudgeGap(members=4), observations)
    assert (held[3], held[4] is None) == (None, False)  # the default window of 2 is full one batch later
    ungrouped = [
        Observation(o.step, o.rewards, completion_ids=o.completion_ids, ensemble_scores=o.ensemble_scores)
        for o in observations
    ]
    assert all(token is None for token in _word_verdicts(JudgeGap(members=4), ungrouped)[1])
    untokened = [
        Observation(o.step, o.rewards, group_size=8, ensemble_scores=o.ensemble_scores) for o in observations
    ]
    assert all(token is None for token in _word_verdicts(JudgeGap(members=4), untokened)[1])


def test_the_word_window_is_saved_checked_and_emptied_by_a_rollback():
    guard = Guard([JudgeGap(members=4)], mode="log_only")
    for observation in _worded(3, hack=True, batch=32, group=8, steps=ONSET + 30):
        guard.step(observation)
    memory = guard.state_dict()["detectors"]["judge_gap"]["memory"]
    earlier = memory["word_previous"]
    assert len(earlier) == 1
    assert PAID in earlier[0]["keys"]
    detector = JudgeGap(members=4)
    assert detector.check_memory(memory, "m") == memory
    with pytest.raises(StateError, match=r"`m\['word_previous'\]` must have at most 1 items, got 2"):
        detector.check_memory(dict(memory, word_previous=earlier * 2), "m")
    broken = dict(earlier[0], keys=earlier[0]["keys"][::-1])
    with pytest.raises(StateError, match="strictly increasing keys"):
        detector.check_memory(dict(memory, word_previous=[broken]), "m")
    with pytest.raises(StateError, match=r"`m\[.word_previous.\]\[0\]\[.bound.\]` must be in \[-10, 10\]"):
        detector.check_memory(dict(memory, word_previous=[dict(earlier[0], bound=11.0)]), "m")
    with pytest.raises(StateError, match="words=True"):
        JudgeGap(members=4, words=False).check_memory(memory, "m")
    working = dict(memory)
    detector.on_rollback(working)
    assert "word_previous" not in working
    with pytest.raises(LoopguardTypeError, match="`words` must be a bool, got 'yes'"):
        JudgeGap(words="yes")


def _noted(guard, observations):
    """Each (step, note) of the run's decisions, and the texts of the RuntimeWarnings it raised."""
    notes = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for observation in observations:
            notes += [(observation.step, note) for note in guard.step(observation).notes]
    return notes, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def _agreements(rows):
    """Each member's correlation with the first on the normal scores of the pooled reference rows (by hand)."""
    z = [_normal_scores_by_hand(row, row) for row in rows]
    return [np.corrcoef(z[0], z[k])[0, 1] for k in range(len(rows))]


def test_the_guard_says_once_which_judges_count_and_which_are_left_out():
    names = ("rm", "linear", "logistic", "unrelated")
    stream = list(_stream(0, gain=1.0))
    observations = [Observation(step, rewards, ensemble_scores=rows) for step, rewards, rows in stream[:12]]
    notes, warned = _noted(Guard([JudgeGap(members=names)], mode="log_only"), observations)

    r = _agreements(np.concatenate([np.array(rows) for _, _, rows in stream[:3]], axis=1))  # 3 reference steps
    assert min(r[1], r[2]) >= 0.5 > r[3], r
    assert notes == [
        (
            3,  # the first step after the reference sample, which closes it
            f"judge_gap: on the reference sample (48 completions), rm is judged by linear ({r[1]:.2f}) and "
            f"logistic ({r[2]:.2f}); unrelated ({r[3]:.2f}) correlates with it below min_agreement 0.5 and is "
            "left out",
        )
    ]
    assert warned == []  # judges remain: nothing to warn about


def test_every_judge_counting_is_said_too_and_members_without_names_are_numbered():
    stream = list(_stream(1, judges=("linear", "logistic")))
    observations = [Observation(step, rewards, ensemble_scores=rows) for step, rewards, rows in stream[:6]]
    notes, warned = _noted(Guard([JudgeGap(members=3)], mode="log_only"), observations)
    r = _agreements(np.concatenate([np.array(rows) for _, _, rows in stream[:3]], axis=1))
    expected = (
        "judge_gap: on the reference sample (48 completions), every judge correlates with member 0 at "
        f"min_agreement 0.5 or more: member 1 ({r[1]:.2f}) and member 2 ({r[2]:.2f})"
    )
    assert notes == [(3, expected)]
    assert warned == []


def test_a_judge_gap_left_with_no_judge_warns_once_and_says_how_to_change_it():
    stream = list(_stream(2, judges=("unrelated", "unrelated"), hack=True))
    observations = [Observation(step, rewards, ensemble_scores=rows) for step, rewards, rows in stream]
    guard = Guard([JudgeGap(members=("rm", "length", "format"))], mode="log_only")
    notes, warned = _noted(guard, observations)
    r = _agreements(np.concatenate([np.array(rows) for _, _, rows in stream[:3]], axis=1))
    text = (
        "judge_gap reads nothing in this run: on the reference sample (48 completions), no judge correlates "
        f"with rm (the trained reward) at min_agreement 0.5 or more: length ({r[1]:.2f}) and format "
        f"({r[2]:.2f}). If they judge what rm measures, lower JudgeGap(min_agreement=...)"
    )
    assert notes == [(3, text)]
    assert warned == [f"loopguard: {text}"]  # once, though the run goes on for 160 steps (and is hacked)

    flat = [Observation(step, [1.0] * 8, ensemble_scores=[[1.0] * 8, list(range(8))]) for step in range(5)]
    notes, warned = _noted(Guard([JudgeGap(members=2)], mode="log_only"), flat)
    text = (
        "judge_gap reads nothing in this run: member 0, the trained reward, has no spread on the reference "
        "sample (24 completions), so no judge can be compared with it"
    )
    assert notes == [(3, text)]
    assert warned == [f"loopguard: {text}"]


def test_rm_ensemble_says_which_members_min_agreement_left_out():
    stream = list(_stream(3, judges=("linear", "unrelated")))
    observations = [Observation(step, rewards, ensemble_scores=rows) for step, rewards, rows in stream[:6]]
    ensemble = RMEnsemble(members=("rm", "linear", "unrelated"), standardize=True, min_agreement=0.5)
    notes, warned = _noted(Guard([ensemble], mode="log_only"), observations)
    pooled = np.concatenate([np.array(rows) for _, _, rows in stream[:3]], axis=1)
    r = np.corrcoef(pooled)[0]  # Pearson, on the pooled moments
    assert r[1] >= 0.5 > r[2], r
    expected = (
        f"rm_ensemble: on the reference sample (48 completions), unrelated ({r[2]:.2f}) correlates with rm "
        "below min_agreement 0.5 and is left out"
    )
    assert notes == [(3, expected)]
    assert warned == []

    lone = RMEnsemble(members=("rm", "unrelated"), min_agreement=0.5)
    observations = [
        Observation(step, rewards, ensemble_scores=[rows[0], rows[2]]) for step, rewards, rows in stream[:6]
    ]
    notes, warned = _noted(Guard([lone], mode="log_only"), observations)
    text = (
        f"rm_ensemble reads nothing in this run: on the reference sample (48 completions), no member "
        f"correlates with rm at min_agreement 0.5 or more (unrelated ({r[2]:.2f})), and one member cannot "
        "disagree with itself"
    )
    assert notes == [(3, text)]
    assert warned == [f"loopguard: {text}"]
    # every member kept is said too; without min_agreement every member counts, and nothing is said
    everyone = [Observation(step, rewards, ensemble_scores=rows) for step, rewards, rows in stream[:6]]
    notes, _ = _noted(Guard([RMEnsemble(members=("rm", "linear", "unrelated"), min_agreement=-1.0)], mode="log_only"), everyone)
    assert notes == [
        (
            3,
            "rm_ensemble: on the reference sample (48 completions), every member correlates with rm at "
            f"min_agreement -1 or more: linear ({r[1]:.2f}) and unrelated ({r[2]:.2f})",
        )
    ]
    notes, _ = _noted(Guard([RMEnsemble(members=3)], mode="log_only"), everyone)
    assert notes == []


@attrs.frozen
class _Unworded(JudgeGap):
    def reference_note(self, memory):
        raise ValueError("no words")


def test_a_reference_note_that_fails_follows_the_failure_policy():
    observations = [Observation(step, rewards, ensemble_scores=rows) for step, rewards, rows in _stream(4)]
    guard = Guard([_Unworded(members=4)], mode="log_only")
    decisions = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decisions += [guard.step(observation) for observation in observations[:5]]
    message = "signal 'judge_gap' could not describe its reference sample: ValueError: no words"
    assert [d.errors for d in decisions] == [(message,)] * 5  # every step, loud each time
    assert sum(message in str(w.message) for w in caught if w.category is RuntimeWarning) == 5
    guard = Guard([_Unworded(members=4)], mode="log_only", on_error="raise")
    with pytest.raises(ValueError, match="no words"):
        guard.step(observations[0])


def test_a_correlation_is_shown_on_its_side_of_min_agreement():
    from loopguard.detectors import _agreement_text

    assert _agreement_text("rm_c", 0.4998, 0.5) == "rm_c (0.4998)"  # left out: never shown as 0.50
    assert _agreement_text("rm_c", 0.50004, 0.5) == "rm_c (0.50)"
    assert _agreement_text("rm_c", 0.42, 0.5) == "rm_c (0.42)"
    assert _agreement_text("rm_b", 0.5041, 0.504) == "rm_b (0.504)"  # kept: never shown as 0.50
    assert _agreement_text("rm_c", 0.5039, 0.504) == "rm_c (0.50)"
    assert _agreement_text("rm_c", None, 0.5) == "rm_c (no spread)"
