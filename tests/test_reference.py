"""Baselines a hack cannot teach: the reference sample, scoring during the warm-up, trends, takeover (issue 15)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from loopguard import Guard, Observation
from loopguard.detectors import Length, Repetition, StepData, Takeover
from loopguard.exceptions import ConfigError, LoopguardTypeError, StateError

B = 16


def healthy(step: int, seed: int = 0) -> Observation:
    """16 completions of 12 random tokens from 5,000: no repetition, every bigram distinct."""
    rng = np.random.default_rng(seed * 1000 + step)
    return Observation(
        step, rng.normal(size=B), completion_ids=rng.integers(0, 5000, size=(B, 12)), group_size=4
    )


def looping(step: int) -> Observation:
    ids = [[7, 8] * 6 for _ in range(B)]
    return Observation(step, [2.0 + 0.01 * i for i in range(B)], completion_ids=ids, group_size=4)


def with_phrase(step: int, share: float, seed: int = 0) -> Observation:
    """Healthy completions, ``share`` of them ending with the phrase 9001 9002 9003."""
    observation = healthy(step, seed)
    ids = observation.completion_ids.tokens.reshape(B, 12).copy()
    ids[: round(share * B), -3:] = [9001, 9002, 9003]
    return Observation(step, observation.rewards, completion_ids=ids, group_size=4)


def converging(step: int) -> Observation:
    """Every third step one more completion becomes a copy of the first: distinct-2 falls 6.25 % at a time."""
    observation = healthy(step)
    ids = observation.completion_ids.tokens.reshape(B, 12).copy()
    ids[1 : 1 + step // 3] = ids[0]
    return Observation(step, observation.rewards, completion_ids=ids, group_size=4)


RELATIVE_ONLY = [Repetition(trapped_bands=None), "diversity"]  # no absolute band: the reference alone


def test_a_healthy_warm_up_takes_no_action_and_says_so():
    guard = Guard(beta=0.01, warmup_steps=10)
    decisions = [guard.step(healthy(step)) for step in range(10)]
    assert all(d.warming_up and d.action == "none" and d.verdict == "OK" for d in decisions)
    assert "warming up (10/10 steps)" in decisions[-1].explanation
    assert guard.reference_batches == 3
    assert all(set(d.scores) == {"repetition"} for d in decisions[:3])  # only the absolute trapped band
    assert set(decisions[3].scores) >= {"repetition", "diversity", "length", "collapse"}  # then the reference


def test_a_loop_from_the_first_steps_is_caught_during_the_warm_up():
    anchored = Guard(RELATIVE_ONLY, beta=0.01, warmup_steps=20)
    unanchored = Guard(RELATIVE_ONLY, beta=0.01, warmup_steps=20, reference_steps=0)
    stream = [healthy(step) for step in range(3)] + [looping(step) for step in range(3, 40)]
    caught = [anchored.step(observation) for observation in stream]
    missed = [unanchored.step(observation) for observation in stream]
    first = next(d for d in caught if d.verdict == "HACK")
    assert first.warming_up
    assert first.step == 3  # the first looping step
    assert "rate 0.818 vs reference 0.000" in first.explanation
    assert caught[first.step + 1].action == "raise_beta"  # bang-bang trips on the second HACK step
    # without the reference, the warm-up learns the loop as normal: never a HACK, not even after it
    assert {d.verdict for d in missed} == {"OK"}
    assert missed[-1].beta_after == 0.01


def test_only_healthy_warm_up_steps_join_the_baseline():
    stream = [healthy(step) for step in range(4)] + [looping(step) for step in range(4, 14)]
    guard = Guard(RELATIVE_ONLY, mode="log_only", warmup_steps=12)
    decisions = [guard.step(observation) for observation in stream]
    assert {d.verdict for d in decisions[4:]} == {"HACK"}  # during the warm-up and after it
    assert (
        guard.state_dict()["detectors"]["repetition"]["baseline"]["rate"][0] == 0.0
    )  # no looping step in it
    plain = Guard(RELATIVE_ONLY, mode="log_only", warmup_steps=12, reference_steps=0)
    assert {plain.step(observation).verdict for observation in stream} == {"OK"}
    assert plain.state_dict()["detectors"]["repetition"]["baseline"]["rate"][0] == pytest.approx(9 / 11)


def test_a_steady_trend_in_the_warm_up_reads_warn_with_the_reason():
    guard = Guard(["repetition", "diversity"], mode="log_only", warmup_steps=30)
    decisions = [guard.step(converging(step)) for step in range(30)]
    warned = next(d for d in decisions if d.verdict != "OK")
    assert warned.verdict == "WARN"
    assert warned.vote == pytest.approx(0.10)  # the trend alone: the scores' vote is below WARN
    assert "diversity.distinct fell steadily through the warm-up" in warned.explanation
    assert "Watching against the reference sample" in warned.explanation
    z = float(re.search(r"trend z = ([-+.\d]+)", warned.explanation).group(1))
    assert z <= -2.33
    assert not any("fell steadily" in d.explanation for d in decisions[: warned.step])
    # no step from the warning on joined the warm-up buffer: the baseline will not learn the trend
    accepted = guard.state_dict()["detectors"]["diversity"]["warm"]["distinct"]
    assert len(accepted) <= warned.step - 3
    assert min(accepted) >= 1.0 - 0.0625 * (warned.step // 3)
    flat = Guard(["repetition", "diversity"], mode="log_only", warmup_steps=30)
    assert all(flat.step(healthy(step)).verdict == "OK" for step in range(30))


def test_reference_batches_drawn_before_training_come_first():
    guard = Guard(RELATIVE_ONLY, beta=0.01, warmup_steps=10)
    for index in range(3):
        guard.add_reference(healthy(100 + index))
    assert guard.reference_batches == 3
    first = guard.step(looping(0))  # scored from the very first training step
    assert first.scores["repetition"] >= 0.3
    with pytest.raises(ConfigError, match=re.escape("must come before the first step")):
        guard.add_reference(healthy(1))
    with pytest.raises(LoopguardTypeError, match="must be an Observation"):
        Guard().add_reference({"rewards": [1.0]})
    with pytest.raises(ConfigError, match=re.escape("reference_steps=0 (off)")):
        Guard(reference_steps=0).add_reference(healthy(0))
    saved = json.loads(json.dumps(guard.state_dict()))
    twin = Guard(RELATIVE_ONLY, beta=0.01, warmup_steps=10)
    twin.load_state_dict(saved)
    for step in range(1, 12):
        assert twin.step(healthy(step)).scores == guard.step(healthy(step)).scores


def test_a_skip_note_from_a_reference_batch_reaches_the_first_decision():
    guard = Guard(beta=0.01, warmup_steps=10)
    bare = Observation(0, np.zeros(B), completion_ids=np.zeros((B, 12), dtype=int))  # no groups: no collapse
    guard.add_reference(bare)
    first = guard.step(Observation(0, np.zeros(B), completion_ids=np.zeros((B, 12), dtype=int)))
    assert any("signal 'collapse' skipped" in note for note in first.notes)


def test_reference_settings_are_checked():
    with pytest.raises(ConfigError, match=re.escape("`reference_steps` must be")):
        Guard(warmup_steps=5, reference_steps=6)
    with pytest.raises(ConfigError, match=re.escape("['takeover'] measure against the reference sample")):
        Guard(["repetition", "takeover"], reference_steps=0)
    saved = Guard(RELATIVE_ONLY, mode="log_only", warmup_steps=5)
    for step in range(4):
        saved.step(healthy(step))
    state = saved.state_dict()
    bad = json.loads(json.dumps(state))
    bad["detectors"]["repetition"]["reference"]["rate"] = [0.0, 2.0, 0.0]
    with pytest.raises(
        StateError, match=re.escape("state['detectors']['repetition']['reference']['rate'][1]")
    ):
        Guard(RELATIVE_ONLY, mode="log_only", warmup_steps=5).load_state_dict(bad)
    bad = json.loads(json.dumps(state))
    bad["detectors"]["repetition"]["reference"]["nope"] = [0.0]
    with pytest.raises(StateError, match=re.escape("is not a baseline statistic of 'repetition'")):
        Guard(RELATIVE_ONLY, mode="log_only", warmup_steps=5).load_state_dict(bad)
    off = Guard(RELATIVE_ONLY, mode="log_only", warmup_steps=5, reference_steps=0)
    with pytest.raises(
        StateError, match=re.escape("must be empty with reference_steps=0, got ['rate', 'trapped']")
    ):
        off.load_state_dict({**state, "config": off.state_dict()["config"]})
    emptied = {**state, "config": off.state_dict()["config"]}
    emptied["detectors"] = {
        name: {**memory, "reference": {}, "recent": []} for name, memory in state["detectors"].items()
    }
    with pytest.raises(
        StateError, match=re.escape("`state['reference_batches']` must be 0 with reference_steps=0")
    ):
        off.load_state_dict(emptied)


def test_takeover_sees_a_phrase_spreading_and_not_healthy_noise():
    guard = Guard(["repetition", "diversity", "takeover"], mode="log_only", warmup_steps=10)
    decisions = [
        guard.step(with_phrase(step, 0.2)) for step in range(3)
    ]  # the reference writes it now and then
    decisions += [guard.step(with_phrase(step, min(1.0, 0.2 + 0.1 * (step - 2)))) for step in range(3, 14)]
    raw = [d.raw.get("takeover.excess_share") for d in decisions]
    assert raw[:3] == [None, None, None]  # the reference sample
    assert raw[3] < 0.2  # 30 % vs 20 % in the reference: within the noise of 16 completions
    first = next(d for d in decisions if d.verdict == "HACK")
    assert first.scores["takeover"] >= 0.3
    assert "excess_share" in first.explanation
    quiet = Guard(["repetition", "diversity", "takeover"], mode="log_only", warmup_steps=10)
    values = [quiet.step(healthy(step, seed=3)).raw.get("takeover.excess_share") for step in range(60)]
    assert max(v for v in values if v is not None) < 0.05


def test_takeover_memory_round_trips_and_is_validated():
    detector = Takeover(keep=16)
    guard = Guard([detector], mode="log_only", warmup_steps=5)
    for step in range(6):
        guard.step(with_phrase(step, 0.5))
    memory = guard.state_dict()["detectors"]["takeover"]["memory"]
    assert memory["rows"] == 3 * B
    assert len(memory["keys"]) == 16  # pruned to `keep`, with a floor for what was dropped
    assert memory["floor"] >= 1
    assert memory["keys"] == sorted(memory["keys"])
    assert detector.check_memory(json.loads(json.dumps(memory)), "m") == memory
    with pytest.raises(StateError, match="strictly increasing keys"):
        detector.check_memory({**memory, "keys": memory["keys"][::-1]}, "m")
    with pytest.raises(StateError, match="only the keys"):
        detector.check_memory({**memory, "extra": 1}, "m")
    with pytest.raises(ConfigError, match=re.escape("`bands` must be (warn, hack) with warn < hack")):
        Takeover(bands=(0.5, 0.2))


def test_takeover_scores_against_the_pool_in_its_memory_when_one_detector_serves_two_guards():
    # the pool's arrays are kept between steps; a loaded state brings another pool, which must be the one read
    shared = Takeover()
    first = Guard([shared], mode="log_only", warmup_steps=5)
    for step in range(6):
        first.step(with_phrase(step, 0.1))  # a pool where the phrase is rare
    other = Guard([Takeover()], mode="log_only", warmup_steps=5)
    for step in range(6):
        other.step(with_phrase(step, 0.6))  # a pool where it is common
    reloaded = Guard([shared], mode="log_only", warmup_steps=5)
    reloaded.load_state_dict(other.state_dict())
    fresh = Guard([Takeover()], mode="log_only", warmup_steps=5)
    fresh.load_state_dict(other.state_dict())
    runs: dict[str, list[float]] = {"reloaded": [], "fresh": [], "first": []}
    for step in range(6, 10):
        observation = with_phrase(step, 0.9)
        for name, guard in (("reloaded", reloaded), ("fresh", fresh), ("first", first)):
            runs[name].append(guard.step(observation).raw["takeover.excess_share"])
    assert runs["reloaded"] == runs["fresh"]
    assert runs["reloaded"][-1] < runs["first"][-1] - 0.2  # the common phrase rose less over its pool


def _with_word(step: int, share: float) -> Observation:
    """Healthy completions; the first ``share`` of them start with the word 9100."""
    observation = healthy(step, seed=5)
    ids = observation.completion_ids.tokens.reshape(B, 12).copy()
    ids[: round(share * B), 0] = 9100
    return Observation(step, observation.rewards, completion_ids=ids, group_size=4)


def _excess(detector: Takeover, shares: list[float]) -> list[float | None]:
    guard = Guard([detector], mode="log_only", warmup_steps=5)
    return [
        guard.step(_with_word(step, share)).raw.get("takeover.excess_share")
        for step, share in enumerate(shares)
    ]


def test_takeover_needs_the_rise_held_over_two_batches_so_one_batch_of_a_favourite_word_is_no_takeover():
    spike = [0.0, 0.0, 0.0, 0.0, 0.0, 0.875, 0.0, 0.0]  # 14 of 16 completions, for one batch only
    alone, held = _excess(Takeover(window=1), spike), _excess(Takeover(), spike)
    assert alone[5] >= 0.4  # one batch alone: HACK
    assert held[5] < 0.0  # the batch before did not have it
    lasting = [0.0, 0.0, 0.0, 0.0, 0.875, 0.875, 0.875, 0.875]
    alone, held = _excess(Takeover(window=1), lasting), _excess(Takeover(), lasting)
    assert held[4] < 0.0  # the first batch of a takeover: held for one batch only...
    assert held[5] >= 0.4  # ...then HACK, one step after the single-batch score
    assert held[5:] == alone[5:]  # the same rise in every batch: the rise it held
    three = _excess(Takeover(window=3), lasting)
    assert three[5] < 0.0  # window=3: held for two batches only...
    assert three[6] == held[6]  # ...then the same


def test_takeover_forgets_the_window_on_a_rollback_and_names_the_scored_ngram():
    detector = Takeover()
    guard = Guard([detector], mode="log_only", warmup_steps=5)
    for step in range(5):
        guard.step(_with_word(step, 0.875 if step >= 3 else 0.0))
    memory = guard.state_dict()["detectors"]["takeover"]["memory"]
    assert len(memory["previous"]) == 1
    assert len(memory["previous"][0]["keys"]) == 64  # the batch's highest excess shares...
    assert -1.0 < memory["previous"][0]["bound"] < 0.0  # ...and a bound on the rest: none of them rose
    assert detector.check_memory(json.loads(json.dumps(memory)), "m") == memory
    data = StepData(_with_word(5, 0.875), warmup_steps=5)
    assert detector.top_ngram(data, memory) == (9100,)  # what the targeted rung would price
    with pytest.raises(StateError, match=re.escape("`m['previous']` must have at most 1 items, got 2")):
        detector.check_memory({**memory, "previous": memory["previous"] * 2}, "m")
    detector.on_rollback(memory)
    assert "previous" not in memory  # the restored policy is scored on its own batches
    with pytest.raises(StateError, match="strictly increasing keys, one excess per key"):
        detector.check_memory(
            {**memory, "previous": [{"keys": [2, 1], "excess": [0.1, 0.2], "bound": 0.0}]}, "m"
        )
    with pytest.raises(StateError, match="together"):
        detector.check_memory({"keys": [], "rows": 3}, "m")
    # a key or count no run could write is a bad saved state (StateError), not a configuration error
    with pytest.raises(StateError, match=re.escape("`m['keys'][0]` must be in [0, ")):
        detector.check_memory({**memory, "keys": [-1, *memory["keys"][1:]]}, "m")
    with pytest.raises(StateError, match=re.escape("`m['counts'][0]` must be an integer")):
        detector.check_memory({**memory, "counts": [0.5, *memory["counts"][1:]]}, "m")
    with pytest.raises(StateError, match=re.escape("`m['previous'][0]['keys'][0]` must be in [0, ")):
        detector.check_memory({**memory, "previous": [{"keys": [-1], "excess": [0.1], "bound": 0.0}]}, "m")
    with pytest.raises(ConfigError, match="window"):
        Takeover(window=0)


def test_an_unscored_takeover_pools_the_reference_and_names_the_ngram_only_when_asked():
    # Takeover(scored=False) keeps the reference pool, reads nothing and so never votes; asked (by the
    # targeted rung, during a hack), it names the batch's most over-represented n-gram, the one a scored
    # takeover reading that batch alone (window=1) scores it by
    unscored, scored = Takeover(scored=False), Takeover(window=1)
    guards = [Guard([detector], mode="log_only", warmup_steps=5) for detector in (unscored, scored)]
    for step in range(6):
        share = 0.875 if step >= 3 else 0.0
        quiet, loud = (guard.step(_with_word(step, share)) for guard in guards)
        assert quiet.verdict == "OK"
        assert not any(key.startswith("takeover") for key in (*quiet.raw, *quiet.scores))
    assert loud.verdict == "HACK"
    memories = [guard.state_dict()["detectors"]["takeover"]["memory"] for guard in guards]
    pool = ("keys", "counts", "floor", "rows")
    assert {key: memories[0][key] for key in pool} == {key: memories[1][key] for key in pool}
    assert set(memories[0]) == set(pool)  # no window, no scored n-gram
    data = StepData(_with_word(6, 0.875), warmup_steps=5)
    assert unscored.top_ngram(data, memories[0]) == (9100,)
    assert unscored.top_ngram(StepData(_with_word(6, 0.0), warmup_steps=5), memories[0]) is None  # none rose
    with pytest.raises(LoopguardTypeError, match="`scored` must be a bool"):
        Takeover(scored=1)


def test_length_alone_votes_on_its_own():
    def lengthening(step):
        rng = np.random.default_rng(step)
        if step < 3:  # the reference: reward unrelated to length
            return Observation(step, rng.normal(size=B), lengths=rng.integers(8, 12, size=B), group_size=4)
        lengths = np.arange(B) + 8 + 4 * step  # then answers grow, and the reward follows them
        return Observation(
            step, lengths * 0.1 + rng.normal(scale=0.01, size=B), lengths=lengths, group_size=4
        )

    corroborating = Guard(["repetition", Length()], mode="log_only", warmup_steps=10)
    alone = Guard(["repetition", Length(alone=True)], mode="log_only", warmup_steps=10)
    assert Length(alone=True).role == "primary"
    assert Length().role == "corroborating"
    assert all(corroborating.step(lengthening(step)).verdict == "OK" for step in range(12))
    verdicts = [alone.step(lengthening(step)).verdict for step in range(12)]
    assert "HACK" in verdicts


def test_takeover_counts_each_ngram_once_per_completion_as_counted_by_hand():
    # in how many completions each n-gram occurs (a completion that repeats one counts it once), compared
    # with a count in plain Python over random batches: short rows, rows shorter than n, repeated tokens
    from loopguard.detectors import _document_counts, _ngram_keys

    rng = np.random.default_rng(11)
    for trial in range(200):
        rows = [
            [int(t) for t in rng.integers(0, int(rng.integers(1, 6)), size=int(rng.integers(0, 10)))]
            for _ in range(int(rng.integers(1, 9)))
        ]
        data = StepData(Observation(0, [0.0] * len(rows), completion_ids=rows), warmup_steps=1)
        for n in (1, 2, 3):
            keys, counts = _document_counts(data, n)
            by_hand: dict[int, int] = {}
            for row in rows:
                ids = np.asarray(row, dtype=np.uint64)
                starts = np.arange(max(len(row) - n + 1, 0), dtype=np.int64)
                for key in {int(k) for k in _ngram_keys(ids, starts, n)}:
                    by_hand[key] = by_hand.get(key, 0) + 1
            assert keys.tolist() == sorted(by_hand), (trial, n)
            assert counts.tolist() == [by_hand[key] for key in sorted(by_hand)], (trial, n)
