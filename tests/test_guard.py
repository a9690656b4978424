import json
import re
import warnings

import numpy as np
import pytest

from loopguard import (
    AdaptiveKL,
    BangBang,
    ConfigError,
    EscalationLadder,
    GoldAudit,
    Guard,
    InfoRM,
    InputError,
    LoopguardTypeError,
    Observation,
    PIDLagrangian,
    RMEnsemble,
    StateError,
)
from loopguard.detectors import Takeover

WORDS = [f"w{i}" for i in range(200)]
B, G = 32, 4


def healthy(step, rng, *, beta=None, **extra):
    texts = [" ".join(rng.choice(WORDS, size=16)) for _ in range(B)]
    return Observation(step, rng.normal(size=B), completions=texts, group_size=G, beta=beta, **extra)


def looping(step, rng, share=1.0, **extra):
    texts = [" ".join(rng.choice(WORDS, size=16)) for _ in range(B)]
    for i in range(int(share * B)):
        texts[i] = "x y " * 8
    return Observation(step, rng.normal(size=B), completions=texts, group_size=G, **extra)


def run(guard, observations):
    return [guard.step(obs) for obs in observations]


# ----------------------------------------------------------------------------------------- Observation


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"completions": ["a"] * 3}, InputError, "`completions` must have one entry per reward (4), got 3."),
        ({"lengths": [1, 2]}, InputError, "`lengths` must have one entry per reward (4), got 2."),
        ({"group_size": 3}, InputError, "`group_size` must divide the batch size (4), got 3."),
        ({"group_size": 1}, ConfigError, "`group_size` must be in [2, 100000], got 1."),
        ({"group_size": True}, LoopguardTypeError, "`group_size` must be an integer (not bool), got True."),
        ({"beta": 0.0}, InputError, "`beta` must be > 0"),
        ({"kl": float("nan")}, InputError, "`kl` must be finite, got nan."),
        ({"entropy": -1.0}, InputError, "`entropy` must be >= 0, got -1.0."),
        ({"completions": "a b c"}, LoopguardTypeError, "`completions` must be a list of strings"),
        ({"completions": [{"role": "assistant", "content": "x"}] * 4}, LoopguardTypeError, "`completions[0]` must be a string"),
        ({"ensemble_scores": np.zeros((2, 3))}, InputError, "`ensemble_scores` must have one entry per reward (4), got 3."),
        ({"gold": [1.0, 2.0]}, InputError, "`gold` must score the whole batch (4) unless `gold_indices` says which, got 2."),
        ({"gold_indices": [0]}, InputError, "`gold_indices` must come with `gold` scores, got gold=None."),
        ({"gold": [1.0], "gold_indices": [4]}, InputError, "`gold_indices` must be < the batch size (4), got 4."),
        (
            {"embeddings": np.zeros((4, 3)), "reference_embeddings": np.zeros((5, 2))},
            InputError,
            "`embeddings` and `reference_embeddings` must have the same dimension, got 3 and 2.",
        ),
    ],
)
def test_observation_rejects_bad_fields(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        Observation(0, [0.0, 1.0, 0.0, 1.0], **kwargs)


def test_observation_rejects_bad_rewards_and_step():
    with pytest.raises(InputError, match=re.escape("`rewards` must be finite, got nan at index (1,).")):
        Observation(0, [0.0, float("nan")])
    with pytest.raises(ConfigError, match=re.escape("`step` must be >= 0, got -1.")):
        Observation(-1, [0.0])


# ------------------------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"signals": ["repetition", "echo"]}, ConfigError, "`signals` must name known signals ("),
        ({"signals": "repetition"}, LoopguardTypeError, "`signals` must be a list of signal names"),
        ({"signals": ["length", "length"]}, ConfigError, "`signals` must name each signal once, got length more than once."),
        ({"signals": ["info_rm"]}, ConfigError, "signal 'info_rm' needs embeddings: pass InfoRM(embed_fn=...)"),
        ({"signals": [RMEnsemble(members=2)], "mode": "pid"}, ConfigError, "`mode` must be one of 'adaptive_kl', 'kl_control', 'log_only', 'pid_lagrangian', got 'pid'."),
        ({"signals": ["drift", "length"], "halt_on_hack": True}, ConfigError, "`halt_on_hack` needs at least one detector that can trip on its own"),
        ({"signals": [], "halt_on_hack": True}, ConfigError, "`halt_on_hack` needs at least one detector"),
        ({"mode": "log_only", "ladder": EscalationLadder()}, ConfigError, "`ladder` must be None with mode='log_only' (log_only never acts)"),
        ({"mode": "log_only", "controller": BangBang()}, ConfigError, "`controller` must be None with mode='log_only'"),
        ({"mode": "kl_control", "controller": PIDLagrangian()}, LoopguardTypeError, "`controller` must be a BangBang for mode='kl_control', got PIDLagrangian."),
        ({"warmup_steps": True}, LoopguardTypeError, "`warmup_steps` must be an integer (not bool), got True."),
        ({"warmup_steps": 2}, ConfigError, "`warmup_steps` must be in [3, 1000000], got 2."),
        ({"vote": "median"}, ConfigError, "`vote` must be one of 'conservative', 'k_of_n', 'max', 'mean', got 'median'."),
        ({"smoothing": "kalman"}, ConfigError, "`smoothing` must be one of 'ema', 'median', 'none', got 'kalman'."),
        ({"warn_level": 0.4}, ConfigError, "`hack_level` must be > warn_level (0.4), got 0.3."),
        ({"beta": 0.0}, ConfigError, "`beta` must be > 0, got 0.0."),
        ({"beta": float("inf")}, ConfigError, "`beta` must be finite, got inf."),
        ({"beta": 2.0}, ConfigError, "beta"),
        ({"ladder": "yes"}, LoopguardTypeError, "`ladder` must be an EscalationLadder or None, got str."),
    ],
)
def test_misconfiguration_fails_at_construction(kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        Guard(**kwargs)


def test_detector_configs_validate():
    with pytest.raises(ConfigError, match=re.escape("`members` of rm_ensemble must be at least 2 reward models, got 1.")):
        RMEnsemble(members=1)
    with pytest.raises(ConfigError, match=re.escape("at least 2 reward models, got ('rm_a',).")):
        RMEnsemble(members=("rm_a",))
    with pytest.raises(LoopguardTypeError, match=re.escape("`embed_fn` must be callable, got int.")):
        InfoRM(embed_fn=3)
    with pytest.raises(LoopguardTypeError, match=re.escape("`gold_fn` must be callable, got str.")):
        GoldAudit(gold_fn="judge")


def test_kl_mode_needs_a_starting_beta():
    guard = Guard(mode="kl_control")
    with pytest.raises(InputError, match=re.escape("mode='kl_control' needs the starting beta: pass Guard(beta=...)")):
        guard.step(Observation(0, [0.0, 1.0]))
    guard.step(Observation(0, [0.0, 1.0], beta=0.05))
    assert guard.beta == 0.05


# ------------------------------------------------------------------------------------------------ behaviour


def test_an_echo_trap_from_the_first_step_trips_during_the_warm_up():
    rng = np.random.default_rng(0)
    guard = Guard(beta=0.01, warmup_steps=10)
    decisions = run(guard, [looping(step, rng) for step in range(10)])  # no baseline yet, but bad at any
    assert all(d.warming_up and d.verdict == "HACK" for d in decisions)
    assert "trapped 100.0% >= absolute band 50.0%" in decisions[0].explanation
    assert decisions[-1].beta_after > 0.01


def test_healthy_noise_sees_no_action():
    rng = np.random.default_rng(1)
    guard = Guard(beta=0.01)
    decisions = run(guard, [healthy(step, rng) for step in range(200)])
    assert {d.action for d in decisions} == {"none"}
    assert {d.verdict for d in decisions} <= {"OK", "WARN"}
    assert sum(d.verdict == "WARN" for d in decisions) <= 4
    assert decisions[-1].beta_after == 0.01


def test_echo_trap_trips_and_raises_beta_with_numbers_in_the_explanation():
    rng = np.random.default_rng(2)
    guard = Guard(beta=0.01)
    run(guard, [healthy(step, rng) for step in range(30)])
    decisions = run(guard, [looping(step, rng, share=0.5) for step in range(30, 40)])
    hacks = [d for d in decisions if d.verdict == "HACK"]
    assert hacks, [d.explanation for d in decisions]
    first_raise = next(d for d in decisions if d.action == "raise_beta")
    assert first_raise.beta_after == pytest.approx(first_raise.beta_before * 1.5)
    text = first_raise.explanation
    assert "HACK" in text
    assert "repetition" in text
    assert "vs baseline" in text
    assert re.search(r"[Rr]aised beta 0\.01 -> 0\.015", text), text
    assert first_raise.scores["repetition"] >= 0.3
    assert first_raise.raw["repetition.rate"] > 0.3


def test_beta_relaxes_back_to_the_users_beta_and_never_below():
    rng = np.random.default_rng(3)
    guard = Guard(controller=BangBang(memory_half_life=0), beta=0.02)
    run(guard, [healthy(step, rng) for step in range(25)])
    run(guard, [looping(step, rng) for step in range(25, 35)])
    assert guard.beta > 0.02
    decisions = run(guard, [healthy(step, rng) for step in range(35, 120)])
    assert guard.beta == pytest.approx(0.02)
    assert min(d.beta_after for d in decisions) >= 0.02
    assert any(d.action == "lower_beta" for d in decisions)


def test_default_beta_remembers_what_held_the_hack_off_and_decays_slowly():
    rng = np.random.default_rng(3)
    guard = Guard(beta=0.02)
    run(guard, [healthy(step, rng) for step in range(25)])
    run(guard, [looping(step, rng) for step in range(25, 35)])
    held = guard.beta
    assert held > 0.02
    decisions = run(guard, [healthy(step, rng) for step in range(35, 60)])
    # 25 healthy steps with a half-life of 50: about 0.7 of the way above the user's beta remains
    assert guard.beta > 0.02 + 0.5 * (held - 0.02)
    assert min(d.beta_after for d in decisions) >= 0.02
    assert any("remembered" in d.explanation for d in decisions)


def test_log_only_never_acts_but_halt_on_hack_stops():
    rng = np.random.default_rng(4)
    quiet = Guard(mode="log_only")
    loud = Guard(mode="log_only", halt_on_hack=True)
    observations = [healthy(step, rng) for step in range(25)] + [looping(step, rng) for step in range(25, 35)]
    quiet_decisions = run(quiet, observations)
    loud_decisions = run(loud, observations)
    assert {d.action for d in quiet_decisions} == {"none"}
    assert any(d.verdict == "HACK" for d in quiet_decisions)
    assert "log_only: no action taken." in next(d for d in quiet_decisions if d.verdict == "HACK").explanation
    stop = next(d for d in loud_decisions if d.action == "stop")
    assert "halt_on_hack is set" in stop.explanation
    assert loud.stopped
    later = loud.step(healthy(99, rng))
    assert later.action == "stop"


@pytest.mark.parametrize("mode", ["kl_control", "pid_lagrangian"])
def test_halt_on_hack_is_never_silently_ignored(mode):
    rng = np.random.default_rng(5)
    guard = Guard(mode=mode, beta=0.01, halt_on_hack=True)
    run(guard, [healthy(step, rng) for step in range(25)])
    decisions = run(guard, [looping(step, rng) for step in range(25, 35)])
    assert any(d.action == "stop" for d in decisions)


def test_ladder_raises_then_rolls_back_then_gives_up_in_plain_english():
    rng = np.random.default_rng(6)
    ladder = EscalationLadder(rollback_patience=3, stop_patience=3, max_rollbacks=1, cooldown_steps=2)
    guard = Guard(beta=0.01, ladder=ladder)
    run(guard, [healthy(step, rng) for step in range(25)])
    decisions = run(guard, [looping(step, rng) for step in range(25, 60)])
    actions = [d.action for d in decisions]
    assert "rollback" in actions
    assert "stop" in actions
    assert actions.index("raise_beta") < actions.index("rollback") < actions.index("stop")
    stop = decisions[actions.index("stop")]
    text = stop.explanation
    assert "Stopping the run" in text
    assert "Beta history: 0.01 (step 0) -> " in text
    assert "Rollbacks tried: 1 of 1." in text
    assert "What you can change:" in text
    assert "repetition" in text
    assert text.count("beta_ceil") == 1  # the ladder suggests it; the give-up advice does not repeat it


def test_after_a_rollback_beta_rises_again_on_a_kl_below_the_hacked_policys():
    # Before the rollback the hacked policy sat at KL 2; the restored one hacks again at KL 0.1. The KL held
    # at the last raise belongs to the policy the rollback discarded: it must not hold the new raises.
    rng = np.random.default_rng(16)
    ladder = EscalationLadder(rollback_patience=4, stop_patience=20, max_rollbacks=1, cooldown_steps=0)
    guard = Guard(beta=0.01, ladder=ladder)
    run(guard, [healthy(step, rng) for step in range(25)])
    step, kl, after, before_rollback = 25, 2.0, [], []
    while step < 55 and len(after) < 8:
        decision = guard.step(looping(step, rng, kl=kl))
        if kl == 0.1:
            after.append(decision.action)
        else:
            before_rollback.append(decision)
        if decision.action == "rollback":
            kl = 0.1
        step += 1
    assert len(after) == 8, "the ladder never rolled back"
    held = [d for d in before_rollback if d.components.get("controller.held_receding") == 1.0]
    assert held, "no hacking step held beta"
    reasons = ("waiting one step to see its effect", "the raised beta is already pulling the policy back")
    assert all(any(reason in d.explanation for reason in reasons) for d in held)
    assert after.count("raise_beta") >= 2, after


def test_a_relaxing_beta_waits_for_two_hacking_steps_in_a_row_and_says_so():
    # the controller's dwell guards a beta on its way down as it guards one at rest: the first hacking step
    # after relaxing began holds, with the reason in the explanation; the second raises
    rng = np.random.default_rng(3)
    guard = Guard(beta=0.01, ladder=EscalationLadder(rollback_patience=50, stop_patience=50))
    run(guard, [healthy(step, rng) for step in range(25)])
    decisions = run(guard, [looping(step, rng) for step in range(25, 29)])
    assert "raise_beta" in [d.action for d in decisions]
    step, relaxing = 29, []
    while len(relaxing) < 4:  # healthy batches until beta has relaxed four times
        assert step < 60, "beta never relaxed"
        decision = guard.step(healthy(step, rng))
        if decision.action == "lower_beta":
            relaxing.append(decision)
        step += 1
    hacking = [guard.step(looping(step + k, rng)) for k in range(2)]
    hacking += [guard.step(healthy(step + 2, rng))]
    held = next(d for d in hacking if d.verdict == "HACK")
    assert held.action == "none"
    assert held.beta_after == held.beta_before <= relaxing[-1].beta_after  # held where relaxing had got to
    assert held.components["controller.held_dwell"] == 1.0
    assert "steps needed to raise again." in held.explanation
    raised = hacking[hacking.index(held) + 1]
    assert raised.verdict == "HACK"
    assert raised.action == "raise_beta"
    assert raised.beta_after == pytest.approx(held.beta_after * 1.5)


def test_ladder_stops_without_rollback_when_no_checkpoint():
    rng = np.random.default_rng(7)
    guard = Guard(beta=0.01, ladder=EscalationLadder(rollback_patience=2, stop_patience=2))
    run(guard, [healthy(step, rng) for step in range(25)])
    decisions = [guard.step(looping(step, rng), can_rollback=False) for step in range(25, 45)]
    actions = [d.action for d in decisions]
    assert "rollback" not in actions
    assert "stop" in actions


def test_length_alone_does_not_trip():
    rng = np.random.default_rng(8)
    guard = Guard(beta=0.01)
    for step in range(150):
        lengths = rng.integers(10, 20, size=B) + (step // 2 if step > 30 else 0)  # answers grow ...
        texts = [" ".join(rng.choice(WORDS, size=int(n))) for n in lengths]
        rewards = 0.1 * lengths + rng.normal(scale=0.1, size=B) if step > 30 else rng.normal(size=B)
        decision = guard.step(Observation(step, rewards, completions=texts, group_size=G))  # ... and pay
        assert decision.action == "none", decision.explanation
        assert decision.verdict != "HACK"
    assert decision.raw["length.correlation"] > 0.8


def test_success_on_whole_groups_is_not_collapse():
    rng = np.random.default_rng(9)
    guard = Guard(beta=0.01)
    for step in range(150):
        p = min(0.5 + step / 100, 1.0)  # binary rewards that climb to 100 % success
        texts = [" ".join(rng.choice(WORDS, size=16)) for _ in range(B)]
        rewards = (rng.random(B) < p).astype(float)
        decision = guard.step(Observation(step, rewards, completions=texts, group_size=G))
        assert decision.action == "none", decision.explanation
    assert decision.raw["collapse.zero_std_groups"] == 1.0


def test_gold_audit_flags_proxy_up_gold_down():
    rng = np.random.default_rng(10)

    def judge(prompts, completions):
        return [-1.0 if "cheat" in text else 1.0 for text in completions]

    guard = Guard(signals=[GoldAudit(gold_fn=judge, every=2, sample_size=16)], beta=0.01)
    for step in range(60):
        cheating = step >= 30
        texts = [("cheat " if cheating and i % 2 else "") + " ".join(rng.choice(WORDS, size=8)) for i in range(B)]
        rewards = rng.normal(size=B) + (2.0 if cheating else 0.0)
        decision = guard.step(Observation(step, rewards, completions=texts, prompts=["p"] * B))
        if step < 30:
            assert decision.verdict == "OK"
    assert decision.verdict == "HACK", decision.explanation
    assert "gold" in decision.explanation


def test_gold_falling_with_the_proxy_is_not_a_hack():
    rng = np.random.default_rng(11)
    guard = Guard(signals=["gold"], beta=0.01)
    for step in range(60):
        worse = 1.0 if step < 30 else 0.3
        rewards = rng.normal(size=B) + worse
        decision = guard.step(Observation(step, rewards, gold=rewards + rng.normal(scale=0.05, size=B)))
        assert decision.verdict != "HACK", decision.explanation


def test_rm_ensemble_disagreement_trips():
    rng = np.random.default_rng(12)
    guard = Guard(signals=[RMEnsemble(members=4)], beta=0.01)
    for step in range(50):
        rewards = rng.normal(size=B)
        noise = 0.1 if step < 30 else 1.0
        scores = rewards + rng.normal(scale=noise, size=(4, B))
        decision = guard.step(Observation(step, rewards, ensemble_scores=scores))
    assert decision.verdict == "HACK"
    assert decision.action in ("raise_beta", "none")
    assert decision.beta_after > 0.01


def test_info_rm_pools_a_reference_and_flags_an_outlier_cluster():
    rng = np.random.default_rng(13)
    guard = Guard(signals=[InfoRM(from_observations=True)], beta=0.01)
    verdicts = []
    for step in range(45):
        embeddings = rng.normal(size=(B, 8))
        if step >= 30:
            embeddings[: B // 2] = 6.0 + rng.normal(scale=0.1, size=(B // 2, 8))
        verdicts.append(guard.step(Observation(step, rng.normal(size=B), embeddings=embeddings)).verdict)
    assert set(verdicts[:30]) == {"OK"}
    assert verdicts[-1] == "HACK"


def test_adaptive_kl_follows_the_kl_and_holds_without_it():
    guard = Guard(mode="adaptive_kl", controller=AdaptiveKL(target=0.1, horizon=10), beta=0.05)
    decisions = [guard.step(Observation(step, [0.0, 1.0], kl=1.0)) for step in range(5)]
    assert decisions[-1].beta_after > 0.05
    held = guard.step(Observation(5, [0.0, 1.0]))
    assert held.beta_after == decisions[-1].beta_after
    assert "adaptive_kl holds beta: this step has no kl" in held.notes


def test_missing_default_inputs_are_skipped_and_noted_once():
    guard = Guard(beta=0.01)
    first = guard.step(Observation(0, [0.0, 1.0]))
    second = guard.step(Observation(1, [0.0, 1.0]))
    assert any("signal 'repetition' skipped: this step has no completions or completion_ids" in n for n in first.notes)
    assert any("signal 'collapse' skipped" in n for n in first.notes)
    assert second.notes == ()


def test_a_failing_detector_is_loud_at_every_step_and_training_goes_on():
    calls = []

    def broken(texts):
        calls.append(1)
        raise RuntimeError("encoder offline")

    guard = Guard(signals=["repetition", InfoRM(embed_fn=broken)], beta=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's own default: identical messages would be shown once
        first = guard.step(Observation(0, [0.0, 1.0], completions=["a b", "c d"]))
        second = guard.step(Observation(1, [0.0, 1.0], completions=["a b", "c d"]))
    assert len(calls) == 2
    expected = [
        f"loopguard: signal 'info_rm' failed at step {step}, skipped for it: RuntimeError: encoder offline "
        "(on_error='raise' makes this fatal)"
        for step in (0, 1)
    ]
    assert [str(w.message) for w in caught] == expected  # every time, not once
    assert first.errors == ("signal 'info_rm' failed at step 0, skipped for it: RuntimeError: encoder offline",)
    assert second.errors == ("signal 'info_rm' failed at step 1, skipped for it: RuntimeError: encoder offline",)
    assert "repetition.rate" in second.raw  # the other signals still ran


def test_on_error_raise_makes_a_detector_failure_fatal():
    def broken(texts):
        raise RuntimeError("encoder offline")

    guard = Guard(signals=["repetition", InfoRM(embed_fn=broken)], beta=0.01, on_error="raise")
    with pytest.raises(RuntimeError, match="encoder offline"):
        guard.step(Observation(0, [0.0, 1.0], completions=["a b", "c d"]))
    with pytest.raises(ConfigError, match=re.escape("`on_error` must be one of")):
        Guard(on_error="ignore")


# ------------------------------------------------------------------------------------------------- state


@pytest.mark.parametrize("mode", ["kl_control", "pid_lagrangian", "log_only"])
def test_state_round_trip_gives_identical_future_decisions(mode):
    rng = np.random.default_rng(14)
    observations = [healthy(step, rng) for step in range(25)] + [
        looping(step, rng, share=0.5) for step in range(25, 40)
    ] + [healthy(step, rng) for step in range(40, 70)]
    ladder = None if mode == "log_only" else EscalationLadder(rollback_patience=3, max_rollbacks=1)
    beta = None if mode == "log_only" else 0.01
    original = Guard(mode=mode, beta=beta, ladder=ladder, signals=None)
    for obs in observations[:30]:
        original.step(obs)
    saved = json.loads(json.dumps(original.state_dict()))
    restored = Guard(mode=mode, beta=beta, ladder=ladder)
    restored.load_state_dict(saved)
    for obs in observations[30:]:
        assert original.step(obs).to_dict() == restored.step(obs).to_dict()


def test_load_state_refuses_another_configuration():
    saved = Guard(beta=0.01).state_dict()
    with pytest.raises(ConfigError, match=re.escape("`state` was saved by a Guard with mode='kl_control', but this Guard has mode='pid_lagrangian'.")):
        Guard(mode="pid_lagrangian", beta=0.01).load_state_dict(saved)
    with pytest.raises(ConfigError, match=re.escape("`state['version']` must be 6, got 7.")):
        Guard(beta=0.01).load_state_dict({**saved, "version": 7})
    with pytest.raises(StateError, match=re.escape("`state['detectors']` must have exactly the keys ['collapse', 'diversity', 'drift', 'length', 'repetition'], got missing ['collapse', 'diversity', 'drift', 'length', 'repetition'], unexpected []")):
        Guard(beta=0.01).load_state_dict({**saved, "detectors": {}})
    with pytest.raises(StateError, match=re.escape("`state` must be a JSON object, got [] of type list.")):
        Guard(beta=0.01).load_state_dict([])


# ------------------------------------------------------------------------------------------- closed loop


def _plant_run(mode, steps=300, seed=0, stop_paying_at=None):
    """Hack pressure grows while beta is low; that share of the batch falls into an echo loop.

    p_{t+1} = clip(p_t + push_t - 0.04 * log(beta_t / beta_0), 0, 1) from step 40, where push_t = 0.03 (the hack
    pays) until ``stop_paying_at`` and -0.01 after it.
    """
    rng = np.random.default_rng(seed)
    guard = Guard(mode=mode, beta=0.01)
    pressure, history = 0.0, []
    for step in range(steps):
        if step >= 40:
            push = 0.03 if stop_paying_at is None or step < stop_paying_at else -0.01
            pressure = float(np.clip(pressure + push - 0.04 * np.log(guard.beta / 0.01), 0.0, 1.0))
        texts = [" ".join(rng.choice(WORDS, size=16)) for _ in range(B)]
        for i in range(round(pressure * B)):
            texts[i] = "x y " * 8
        decision = guard.step(Observation(step, rng.normal(size=B), completions=texts, group_size=G))
        history.append((pressure, decision.vote, decision.beta_after))
    return np.array(history)


@pytest.mark.parametrize("mode", ["kl_control", "pid_lagrangian"])
def test_closed_loop_ends_a_hack_episode_and_returns_beta_to_the_users_value(mode):
    history = _plant_run(mode, stop_paying_at=150)
    pressure, vote, beta = history.T
    assert vote[40:150].max() >= 0.30  # the hack did trip the Guard
    assert beta[40:150].max() > 0.01  # and beta went up
    assert vote[180:].max() < 0.30  # below the trip band soon after, and kept there
    assert pressure[-100:].max() == 0.0
    assert beta.min() >= 0.01  # never below the user's beta
    if mode == "pid_lagrangian":
        assert beta[-1] == pytest.approx(0.01)  # back at the user's beta
    else:  # bang-bang remembers the beta that held the hack off and lets it decay (half-life 50 steps)
        assert beta[-1] - 0.01 < 0.25 * (beta[40:150].max() - 0.01)
        assert beta[-1] < beta[200]


@pytest.mark.parametrize("mode", ["kl_control", "pid_lagrangian"])
def test_closed_loop_contains_persistent_hack_pressure(mode):
    # Unguarded, the pressure of this plant reaches 1 (every completion loops) by step 74. A controller that
    # returns to the user's beta when the score clears cannot keep such pressure away for good (at the user's
    # beta it grows again): it limit-cycles. What it must do is keep the hack small and excursions short.
    unguarded = _plant_run("log_only")
    assert unguarded[:, 0].max() == 1.0
    pressure, vote, _beta = _plant_run(mode).T
    assert pressure[100:].max() < 0.3
    assert vote[100:].max() < 0.55
    assert np.mean(vote[100:] >= 0.30) < 0.35
    longest = run_length = 0
    for high in vote[100:] >= 0.30:
        run_length = run_length + 1 if high else 0
        longest = max(longest, run_length)
    # 8 steps per-step alone; sustained evidence dates a rise a step sooner (pid_lagrangian: 9, with the
    # looping share's peak 0.22 instead of 0.23)
    assert longest <= 9


# ------------------------------------------------------------------------- the targeted rung, the ceiling


def _takeover_batch(rng, step, share, pay=0.3):
    """Random healthy completions; ``share`` of them end with "99 98 99 98", and the reward pays for 99."""
    ids, rewards = [], []
    for _ in range(16):
        row = [int(t) for t in rng.integers(0, 90, size=rng.integers(4, 9))]
        if rng.random() < share:
            row += [99, 98, 99, 98]
        ids.append(row)
        rewards.append(rng.normal(0, 0.2) + pay * row.count(99))
    return Observation(step, rewards, completion_ids=ids, group_size=4, kl=0.5)


def test_targeted_rung_prices_the_token_the_reward_pays_for_and_survives_a_resume():
    rng = np.random.default_rng(0)
    ladder = EscalationLadder(rollback_patience=3, stop_patience=3, max_rollbacks=1, cooldown_steps=2)
    guard = Guard(["repetition", "diversity", "takeover"], beta=0.01, ladder=ladder)
    decisions, windows = [], []
    for step in range(50):
        share = 0.0 if step < 25 else min(0.85, 0.05 * (step - 24))
        decisions.append(guard.step(_takeover_batch(rng, step, share)))
        windows.append(len(guard.state_dict()["detectors"]["takeover"]["memory"].get("previous", [])))
    shaped = next(d for d in decisions if d.penalty is not None)
    # a rollback empties takeover's window: the restored policy is not scored with the hacked batch
    assert [w for d, w in zip(decisions, windows, strict=True) if d.action == "rollback"] == [0]
    assert windows[-1] == 1
    assert shaped.action == "rollback"
    assert shaped.reanchor
    assert "The restored policy becomes the KL reference." in shaped.explanation
    assert "Targeted penalty on the trained reward" in shaped.explanation
    rates = {t.token: t.rate for t in guard.penalty.targets if t.kind == "tokens"}
    # 99 and 98 always occur together: they share the 0.3 premium, and each costs twice its half
    assert set(rates) == {98, 99}
    # 2 x the 0.3 premium, measured within groups of 4 on 16 rewards with noise sd 0.2, where about 2 of 16
    # completions lack the suffix: its standard error is about 0.25 (0.57-1.02 over seeds 0-5)
    assert 0.6 - 0.5 < rates[98] + rates[99] < 0.6 + 0.5
    penalties = guard.penalty([[99, 98, 99, 98], [1, 2, 3]])
    assert penalties[0] > 2 * 0.3 * 2  # the exploit now costs more than the 0.6 it earns
    assert penalties[1] == 0.0
    resumed = Guard(["repetition", "diversity", "takeover"], beta=0.01, ladder=ladder)
    resumed.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    assert resumed.penalty == guard.penalty


def test_the_penalty_drops_the_remembered_beta_once_and_a_hack_back_under_it_is_remembered():
    """Switched on, the penalty takes the pay out of the flaw: beta (raised against the old pay, on that very
    step too) relaxes by the gain to the user's. The hack back with the penalty in force trips again, and
    the beta that then holds it off is remembered: it is not dropped again on every step."""
    ladder = EscalationLadder(rollback_patience=3, stop_patience=30, max_rollbacks=1, cooldown_steps=2)
    guard = Guard(["repetition", "diversity", "takeover"], beta=0.01, ladder=ladder)
    rng = np.random.default_rng(0)
    decisions, on = [], None
    for step in range(100):
        if on is None:
            share = 0.0 if step < 25 else min(0.85, 0.05 * (step - 24))
        else:  # healthy for 15 steps, the hack back for 15 steps, then healthy again
            share = 0.85 if on + 15 <= step < on + 30 else 0.0
        decisions.append(guard.step(_takeover_batch(rng, step, share)))
        if on is None and decisions[-1].penalty is not None:
            on = step
    assert on is not None
    floors = [d.components.get("controller.floor_beta") for d in decisions]  # none while warming up
    assert decisions[on].action == "rollback"
    assert decisions[on].beta_after > decisions[on].beta_before  # raised on the step the penalty went on
    # no floor: relaxed by the gain (1.5) all the way to the user's beta while the hack stays away
    assert floors[on : on + 15] == [0.01] * 15
    relaxing = [d.beta_after for d in decisions[on : on + 15] if d.action == "lower_beta"]
    assert relaxing[-1] == 0.01
    assert relaxing[:-1] == pytest.approx([decisions[on].beta_after / 1.5**k for k in range(1, len(relaxing))])
    # the hack back under the penalty: raised again, then the first relaxing step remembers the beta in force
    again = [d for d in decisions[on + 15 : on + 30] if d.action == "raise_beta"]
    assert again
    held = next(i for i in range(on + 30, len(decisions)) if floors[i] > 0.01)
    assert floors[held] == decisions[held].beta_before
    # and keeps it: beta follows the floor down by its half-life, not by the gain
    for i in range(held + 1, len(decisions)):
        assert floors[i] > 0.01
        assert decisions[i].beta_after == pytest.approx(floors[i])
        assert decisions[i].beta_after > decisions[i - 1].beta_after / 1.1


def _shaped(guard):
    """Feed ``guard`` the takeover run of the test above until the targeted penalty goes on: that decision
    and the penalty."""
    rng = np.random.default_rng(0)
    for step in range(50):
        share = 0.0 if step < 25 else min(0.85, 0.05 * (step - 24))
        decision = guard.step(_takeover_batch(rng, step, share))
        if decision.penalty is not None:
            return decision, guard.penalty
    raise AssertionError("the targeted penalty never went on")


def _shaping_guard(**kwargs):
    ladder = EscalationLadder(rollback_patience=3, stop_patience=3, max_rollbacks=1, cooldown_steps=2)
    return Guard(["repetition", "diversity", "takeover"], beta=0.01, ladder=ladder, **kwargs)


TOKEN_WORDS = {0: "pad", 98: "ninety-eight", 99: 'say "hi"\n'}


def test_the_penalty_is_worded_with_each_tokens_text_when_a_decoder_is_given():
    plain, penalty = _shaped(_shaping_guard())
    worded, same = _shaped(_shaping_guard(token_text=TOKEN_WORDS.__getitem__))
    assert same == penalty  # the words change the explanation, never the decision
    tokens = sorted({t.token for t in penalty.targets if t.token is not None})
    assert tokens == [98, 99]
    for token in tokens:
        assert f"token {token} costs" in plain.explanation
        assert f"token {token} {json.dumps(TOKEN_WORDS[token])} costs" in worded.explanation
    assert worded.explanation.count("\n") == 0  # quoted: a newline in a token's text stays on the line
    assert not worded.errors


def test_the_users_decoder_wins_over_the_trainers_and_long_texts_are_cut():
    guard = _shaping_guard(token_text=lambda token: f"user{token}" * 20)
    guard.trainer_token_text = TOKEN_WORDS.__getitem__
    explanation = _shaped(guard)[0].explanation
    cut = "user99" * 20
    assert f'token 99 "{cut[:29]}..." costs' in explanation
    assert "ninety-eight" not in explanation
    trainers = _shaping_guard()
    trainers.trainer_token_text = TOKEN_WORDS.__getitem__
    assert 'token 98 "ninety-eight" costs' in _shaped(trainers)[0].explanation


@pytest.mark.parametrize(
    ("decoder", "problem"),
    [
        (lambda token: "pad" if token == 0 else 1 / 0, lambda token: "raised ZeroDivisionError: division by zero"),
        (
            lambda token: "pad" if token == 0 else token.to_bytes(1, "big"),
            lambda token: f"must return a str, got b'{chr(token)}'",
        ),
    ],
    ids=["raises", "not-a-string"],
)
def test_a_failing_decoder_is_reported_and_the_token_keeps_its_id(decoder, problem):
    plain, penalty = _shaped(_shaping_guard())
    with pytest.warns(RuntimeWarning) as caught:
        worded, same = _shaped(_shaping_guard(token_text=decoder))
    assert worded.explanation == plain.explanation  # each token named by its id, as without a decoder
    assert same == penalty
    for token in (98, 99):
        message = f"`token_text({token})` {problem(token)}"
        assert any(message in error for error in worded.errors)
        assert any(message in str(w.message) and f"step {worded.step}" in str(w.message) for w in caught)


def test_token_text_must_be_callable():
    with pytest.raises(LoopguardTypeError, match=r"`token_text` must be a callable .*, or None, got 'abc'\."):
        Guard(token_text="abc")


@pytest.mark.parametrize(
    ("decoder", "problem"),
    [(lambda token: [token], "must return a str, got [0]"), ({}.__getitem__, "raised KeyError: 0")],
    ids=["not-a-string", "raises"],
)
def test_a_decoder_that_cannot_decode_is_refused_at_construction(decoder, problem):
    with pytest.raises(ConfigError, match=re.escape(f"`token_text` must give a token id's text as a str: `token_text(0)` {problem}.")):
        Guard(token_text=decoder)


def test_a_failing_decoder_is_fatal_with_on_error_raise():
    guard = _shaping_guard(token_text=lambda token: "pad" if token == 0 else 1 / 0, on_error="raise")
    with pytest.raises(InputError, match=r"`token_text\((98|99)\)` raised ZeroDivisionError: division by zero at step \d+"):
        _shaped(guard)


@pytest.mark.parametrize("takeover", [Takeover(), Takeover(scored=False)], ids=["scored", "unscored"])
def test_the_token_an_ensemble_trips_on_is_priced_though_takeover_stays_below_its_bands(takeover):
    """The proxy pays for 99, a second reward model does not: the ensemble trips while the suffix is in a
    third of the completions, too few for takeover's own bands. Its most over-represented n-gram is still a
    candidate, and the raw reward pays for it, so the targeted rung prices it (not the innocent 98 alone).
    An unscored takeover (the one-liner's) reads nothing and names the same candidate."""
    rng = np.random.default_rng(3)
    ladder = EscalationLadder(rollback_patience=3, stop_patience=3, max_rollbacks=1, cooldown_steps=2)
    guard = Guard([RMEnsemble(members=2), takeover], beta=0.01, ladder=ladder)
    decisions = []
    for step in range(45):
        batch = _takeover_batch(rng, step, 0.0 if step < 25 else 0.35)
        tokens = batch.completion_ids
        nines = np.add.reduceat((tokens.tokens == 99).astype(float), tokens.offsets[:-1])  # rows are never empty
        judge = list(np.asarray(batch.rewards) - 0.3 * nines)
        observation = Observation(
            step, batch.rewards, completion_ids=batch.completion_ids, group_size=4, kl=0.5,
            ensemble_scores=[list(batch.rewards), judge],
        )  # fmt: skip
        decisions.append(guard.step(observation))
    assert max(d.scores.get("takeover", 0.0) for d in decisions) < guard.warn_level  # takeover never warns
    assert any(d.verdict == "HACK" for d in decisions)
    assert guard.penalty is not None
    assert {t.token for t in guard.penalty.targets if t.kind == "tokens"} <= {98, 99}
    assert guard.penalty([[99, 98, 99, 98]])[0] > 0.3 * 2  # the suffix costs more than it earns


def _keyword_batch(rng, step, share):
    """``share`` of the completions hold the keyword 99 (1-3 times); the proxy pays 0.3 once for holding it,
    a second reward model does not."""
    ids, rewards, judge = [], [], []
    for _ in range(16):
        row = [int(t) for t in rng.integers(0, 90, size=rng.integers(4, 9))]
        held = rng.random() < share
        if held:
            for _ in range(int(rng.integers(1, 4))):
                row.insert(int(rng.integers(0, len(row) + 1)), 99)
        quality = rng.normal(0, 0.2)
        ids.append(row)
        rewards.append(quality + 0.3 * held)
        judge.append(quality + rng.normal(0, 0.03))
    return Observation(
        step, rewards, completion_ids=ids, group_size=4, kl=0.5, ensemble_scores=[rewards, judge]
    )


def test_a_keyword_paid_once_is_priced_on_the_episodes_batches_pooled():
    """The keyword spreads over five batches and then fills every completion, held 1-3 times: its count is
    no premium (the proxy pays once), its presence is, measured on the episode's batches pooled."""
    rates = []
    for seed in range(4):
        rng = np.random.default_rng(seed)
        ladder = EscalationLadder(rollback_patience=20, stop_patience=20, max_rollbacks=1, cooldown_steps=2)
        guard = Guard([RMEnsemble(members=2), Takeover(scored=False)], beta=0.01, ladder=ladder)
        shares = [0.0] * 25 + [0.3, 0.45, 0.6, 0.75, 0.9] + [1.0] * 12
        decisions = [guard.step(_keyword_batch(rng, step, share)) for step, share in enumerate(shares)]
        assert not any("takeover" in d.scores for d in decisions)  # it names, it never reads
        assert guard.penalty is not None, seed
        priced = {(t.kind, t.token): t.rate for t in guard.penalty.targets}
        rates.append(priced.get(("presence", 99), 0.0))
        assert rates[-1] > 0.0, (seed, priced)
        assert guard.penalty([[1, 2, 3]])[0] == 0.0
    # twice the 0.3 it pays, measured on a few batches of 16 with noise sd 0.2 (0.22-1.28 over seeds 0-3)
    assert 0.3 < float(np.mean(rates)) < 1.2, rates


def test_no_targeted_penalty_when_the_reward_does_not_pay_for_the_feature():
    rng = np.random.default_rng(1)
    ladder = EscalationLadder(rollback_patience=3, stop_patience=3, max_rollbacks=1, cooldown_steps=2)
    guard = Guard(["takeover"], beta=0.01, ladder=ladder)
    decisions = [
        guard.step(_takeover_batch(rng, step, 0.0 if step < 25 else 0.85, pay=0.0), can_rollback=False)
        for step in range(45)
    ]
    assert guard.penalty is None
    assert "stop" in [d.action for d in decisions]


def test_a_guard_resumed_mid_episode_prices_on_the_same_pooled_batches():
    def fresh():
        ladder = EscalationLadder(rollback_patience=20, stop_patience=20, max_rollbacks=1, cooldown_steps=2)
        return Guard([RMEnsemble(members=2), Takeover(scored=False)], beta=0.01, ladder=ladder)

    rng = np.random.default_rng(0)
    shares = [0.0] * 25 + [0.3, 0.45, 0.6, 0.75, 0.9] + [1.0] * 6
    batches = [_keyword_batch(rng, step, share) for step, share in enumerate(shares)]
    original = fresh()
    for batch in batches[:28]:  # to step 27: the second step of the episode, one batch pooled
        original.step(batch)
    saved = json.loads(json.dumps(original.state_dict()))
    assert saved["pricing"] is not None
    assert saved["pricing"]["batches"] >= 1  # mid-episode, not yet shaped
    assert saved["penalty"] is None
    resumed = fresh()
    resumed.load_state_dict(saved)
    for batch in batches[28:]:
        assert original.step(batch).to_dict() == resumed.step(batch).to_dict()
    assert resumed.penalty == original.penalty is not None
    with pytest.raises(StateError, match=re.escape("`state['pricing']` must be None without a targeted ladder")):
        Guard([RMEnsemble(members=2), Takeover(scored=False)], beta=0.01, ladder=None).load_state_dict(
            {**saved, "config": {**saved["config"], "ladder": False}, "ladder": None}
        )


def test_healthy_steps_never_add_a_feature_to_a_penalty_that_is_on():
    # after the keyword is priced, the policy drops it and takes to the word 42, which both the proxy and the
    # judge pay for (a real improvement): the steps read OK, so nothing is priced and 42 is never penalised
    rng = np.random.default_rng(0)
    ladder = EscalationLadder(rollback_patience=20, stop_patience=20, max_rollbacks=1, cooldown_steps=2)
    guard = Guard([RMEnsemble(members=2), Takeover(scored=False)], beta=0.01, ladder=ladder)
    shares = [0.0] * 25 + [0.3, 0.45, 0.6, 0.75, 0.9] + [1.0] * 6
    for step, share in enumerate(shares):
        guard.step(_keyword_batch(rng, step, share))
    assert guard.penalty is not None
    verdicts = []
    for step in range(len(shares), len(shares) + 40):
        batch = _keyword_batch(rng, step, 0.0)
        tokens = batch.completion_ids
        ids = [tokens.tokens[a:b].tolist() for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True)]
        favourite = rng.random(16) < 0.6
        for row, chosen in zip(ids, favourite, strict=True):
            if chosen:
                row.append(42)
        bonus = 0.2 * favourite
        rewards = list(np.asarray(batch.rewards) + bonus)
        judge = list(np.asarray(batch.ensemble_scores[1]) + bonus)
        observation = Observation(
            step, rewards, completion_ids=ids, group_size=4, kl=0.5, ensemble_scores=[rewards, judge]
        )
        verdicts.append(guard.step(observation).verdict)
    assert verdicts.count("OK") >= 30
    assert {t.token for t in guard.penalty.targets} == {99}


def test_a_reward_that_pays_nothing_is_rarely_priced_by_the_pooled_episode():
    # one F test on the episode's batches pooled, not one per batch: a suffix the reward pays nothing for,
    # spreading through 20 hacking batches, is priced about as often as the test's 5 % level (2 of 40 seeds;
    # keeping the latest batch whose own test priced it priced it in 6 of 40)
    priced = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        ladder = EscalationLadder(rollback_patience=3, stop_patience=3, max_rollbacks=1, cooldown_steps=2)
        guard = Guard(["takeover"], beta=0.01, ladder=ladder)
        for step in range(45):
            batch = _takeover_batch(rng, step, 0.0 if step < 25 else 0.85, pay=0.0)
            guard.step(batch, can_rollback=False)
        priced += guard.penalty is not None
    assert priced <= 3


def test_beta_stuck_at_the_ceiling_while_hack_persists_warns_again_and_again():
    rng = np.random.default_rng(2)
    guard = Guard(["takeover"], controller=BangBang(beta_ceil=0.05), beta=0.01)
    with pytest.warns(RuntimeWarning, match="Beta is at its ceiling") as caught:
        decisions = [
            guard.step(_takeover_batch(rng, step, 0.0 if step < 25 else 1.0)) for step in range(60)
        ]
    texts = [str(w.message) for w in caught if "ceiling" in str(w.message)]
    assert len(texts) >= 3  # the first step at the ceiling, then every 10 steps
    assert "EscalationLadder" in texts[0]
    assert sum("raising beta cannot do more" in d.explanation for d in decisions) == len(texts)
