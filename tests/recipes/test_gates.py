"""Safety gates: pure evaluation against hand-computed values, and a tripped gate blocking promotion in a real run."""

import json
import math
import os

import numpy as np
import pytest
from recipe_helpers import PROMPTS, dpo_args, low_words, tiny_policy
from scipy.stats import ks_2samp, spearmanr

from loopguard.recipes import IterativeDPO, SafetyGates, evaluate_gates


def test_gate_values_match_independent_references():
    rng = np.random.default_rng(0)
    rewards, reference = rng.normal(size=40), rng.normal(size=40)
    lengths = rng.integers(1, 30, size=40)
    texts = ["a b a b", "a b c d"] * 20
    results = {
        r.name: r
        for r in evaluate_gates(rewards=rewards, lengths=lengths, texts=texts, reference_rewards=reference)
    }
    assert results["length_correlation"].value == pytest.approx(spearmanr(rewards, lengths).statistic)
    assert results["reward_drift"].value == pytest.approx(ks_2samp(rewards, reference).statistic)
    # "a b a b": bigrams ab, ba, ab -> 1 of 3 repeated; "a b c d": none -> mean 1/6
    assert results["repetition"].value == pytest.approx(1 / 6)
    assert not any(r.tripped for r in results.values())


def test_gold_and_ensemble_gates():
    base = dict(
        rewards=[1.0, 2.0, 3.0], lengths=[3, 3, 3], texts=["a b c"] * 3, reference_rewards=[1.0, 2.0, 3.0]
    )
    results = evaluate_gates(
        **base,
        gold=[0.5, 0.5, 0.5],
        reference_gold=[1.0, 1.0, 1.0],
        ensemble_scores=[[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]],
        reference_ensemble_scores=[[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]],
    )
    gold, ensemble = results[-2], results[-1]
    assert (gold.name, gold.value, gold.tripped) == ("gold_drop", 0.5, True)
    assert gold.message == (
        "gold score drop (1.000 -> 0.500) 0.500 > max 0.100: the proxy reward rose while the gold audit fell "
        "(reward hacking)"
    )
    assert (ensemble.name, ensemble.value, ensemble.tripped) == ("ensemble_disagreement", 4.0, True)
    # a zero starting gold mean: absolute fall; a zero starting disagreement: 1 if still 0, else inf
    zero = evaluate_gates(
        **base,
        gold=[-0.5] * 3,
        reference_gold=[0.0] * 3,
        ensemble_scores=[[0.0] * 3, [1.0] * 3],
        reference_ensemble_scores=[[1.0] * 3, [1.0] * 3],
    )
    assert zero[-2].value == 0.5
    assert math.isinf(zero[-1].value)
    assert zero[-1].to_json()["value"] == "inf"


def test_gates_can_be_turned_off():
    off = SafetyGates(max_length_correlation=None, max_repetition=None, max_reward_drift=None)
    assert (
        evaluate_gates(
            rewards=[1.0, 9.0],
            lengths=[1, 9],
            texts=["x x x", "x x x"],
            reference_rewards=[0.0, 0.0],
            gates=off,
        )
        == ()
    )


class AuditedGold:
    """A gold scorer that agrees with the proxy except on the audit samples of the rounds in ``bad_rounds``.

    The recipe calls it twice per round (the round's samples, then the candidate's audit samples), so call
    ``2 * r`` is round r's audit: on those it returns 0, a 100 % gold drop.
    """

    def __init__(self, bad_rounds):
        self.bad_rounds = set(bad_rounds)
        self.calls = 0

    def __call__(self, prompts, completions):
        self.calls += 1
        audit_of = self.calls // 2 if self.calls % 2 == 0 else None
        return [0.0 if audit_of in self.bad_rounds else 1.0] * len(completions)


def _metrics(folder, number):
    with open(os.path.join(folder, f"round-{number:02d}", "metrics.json")) as handle:
        return json.load(handle)


def test_tripped_gate_blocks_promotion_and_next_round_restarts_from_last_good(tmp_path, tokenizer):
    # only the gold gate is under test here: the proxy's other gates are switched off so no other trip can
    # block round 3 (on this tiny model, empty completions score 0 and can correlate reward with length)
    gates = SafetyGates(max_length_correlation=None, max_repetition=None, max_reward_drift=None)
    recipe = IterativeDPO(
        tiny_policy(tokenizer),
        tokenizer,
        PROMPTS,
        low_words,
        rounds=3,
        output_dir=tmp_path,
        dpo_args=dpo_args(),
        max_new_tokens=6,
        gold=AuditedGold(bad_rounds={2}),
        gates=gates,
    )
    result = recipe.run()
    assert [r["promoted"] for r in result.rounds] == [True, False, True]
    blocked = _metrics(tmp_path, 2)
    assert blocked["promoted"] is False
    assert blocked["reasons"] == [
        "gold score drop (1.000 -> 0.000) 1.000 > max 0.100: the proxy reward rose while the gold audit fell "
        "(reward hacking)."
    ]
    assert "round 2 was not promoted" in blocked["explanation"]
    third = _metrics(tmp_path, 3)
    # round 3 starts again from round 1's policy, and uses it as its reference
    assert third["policy_from"] == third["reference"] == "round-01/model"
    assert (
        third["weights"]["reference_fingerprint"] == _metrics(tmp_path, 1)["weights"]["candidate_fingerprint"]
    )
    assert third["weights"]["reference_fingerprint"] == blocked["weights"]["reference_fingerprint"]
    assert result.policy == os.path.join(str(tmp_path), "round-03", "model")
    assert not result.stopped
    assert "Blocked. Round 2: gold score drop" in result.explanation


def test_run_stops_after_max_failed_rounds_with_an_explanation(tmp_path, tokenizer):
    recipe = IterativeDPO(
        tiny_policy(tokenizer),
        tokenizer,
        PROMPTS,
        low_words,
        rounds=3,
        output_dir=tmp_path,
        dpo_args=dpo_args(max_steps=1),
        max_new_tokens=6,
        gold=AuditedGold(bad_rounds={1}),
        max_failed_rounds=1,
    )
    result = recipe.run()
    assert result.stopped
    assert [r["round"] for r in result.rounds] == [1]
    assert not os.path.exists(tmp_path / "round-02")
    initial = os.path.join(str(tmp_path), "initial", "model")
    assert result.policy == initial
    assert result.explanation.startswith(
        "Stopped after round 1: 1 round(s) failed their safety gates (max_failed_rounds=1). Round 1: gold score "
        "drop (1.000 -> 0.000) 1.000 > max 0.100"
    )
    assert f"The last policy that passed is {initial}; it stays the result." in result.explanation
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["stopped"] is True
    assert manifest["explanation"] == result.explanation
    # a rerun of a stopped run trains nothing and reports the same outcome
    gold = AuditedGold(bad_rounds=set())
    again = IterativeDPO(
        tiny_policy(tokenizer),
        tokenizer,
        PROMPTS,
        low_words,
        rounds=3,
        output_dir=tmp_path,
        dpo_args=dpo_args(max_steps=1),
        max_new_tokens=6,
        gold=gold,
        max_failed_rounds=1,
    ).run()
    assert gold.calls == 0
    assert again.stopped
    assert again.explanation == result.explanation


def test_a_round_without_pairs_is_blocked_and_counted(tmp_path, tokenizer):
    def constant(prompts, completions):
        return [1.0] * len(completions)

    recipe = IterativeDPO(
        tiny_policy(tokenizer),
        tokenizer,
        PROMPTS,
        constant,
        rounds=3,
        output_dir=tmp_path,
        dpo_args=dpo_args(),
        max_new_tokens=6,
    )
    result = recipe.run()
    assert result.stopped
    assert [r["round"] for r in result.rounds] == [1, 2]
    reason = "round 1 produced no pairs: every prompt's 4 completions tied within min_margin=0; nothing to train on."
    assert result.rounds[0]["reasons"] == [reason]
    assert result.rounds[0]["candidate"] is None
    assert (tmp_path / "round-01" / "pairs.jsonl").read_text() == ""
    assert not (tmp_path / "round-01" / "model").exists()


def test_gates_measure_with_the_guards_detectors():
    """One concept, one implementation: a gate's value is the statistic the Guard's detector measures."""
    from loopguard import Observation
    from loopguard.detectors import Length, Repetition, StepData

    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(list("abcde"), size=int(rng.integers(2, 12)))) for _ in range(24)]
    rewards, lengths = rng.normal(size=24), np.asarray([len(t.split()) for t in texts])
    gates = SafetyGates(repetition_n=3)
    results = {
        r.name: r
        for r in evaluate_gates(
            rewards=rewards, lengths=lengths, texts=texts, reference_rewards=rng.normal(size=24), gates=gates
        )
    }
    data = StepData(Observation(0, rewards, completions=texts, lengths=lengths), warmup_steps=1)
    assert results["repetition"].value == Repetition(n=3).measure(data, {})["rate"]
    assert results["repetition"].message.startswith("3-gram repetition")
    assert results["length_correlation"].value == Length().measure(data, {})["correlation"]


def test_a_gate_that_cannot_measure_is_an_error_not_silence():
    with pytest.raises(Exception, match="length_correlation gate needs"):
        evaluate_gates(rewards=[1.0], lengths=[3], texts=["a b c"], reference_rewards=[0.0, 1.0])
    with pytest.raises(Exception, match="`reference_rewards` must"):
        evaluate_gates(rewards=[1.0, 2.0], lengths=[3, 4], texts=["a", "b"], reference_rewards=[[0.0]])
