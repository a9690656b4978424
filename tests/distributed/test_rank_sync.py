"""Rank-synchronised decisions: the RankSync reductions, and RewardHackMitigator under 2-process GRPO (gloo).

The 2-process tests launch ``grpo_rank_worker.py`` with ``python -m torch.distributed.run`` on CPU: only
rank 1's local (tapped) data carries the hack. ``LOOPGUARD_TEST_NOSYNC=1`` makes the worker run without the
reduction, which makes ``test_grpo_ranks_take_one_decision`` fail (how the test was shown to be able to fail).
"""

from __future__ import annotations

import os
import pathlib
import warnings

import pytest

pytest.importorskip("trl")

from launch_helpers import launch

from loopguard import Guard, Observation
from loopguard.adapters._distributed import (
    RankSync,
    decision_from_dict,
    severity,
    synced_restore,
    synced_step,
)


def check_invariants(results):
    """The rank-sync invariants over the two ranks' records (raises AssertionError when one is broken)."""
    zero, one = results
    assert zero["steps"] == one["steps"], "ranks took different actions or hold different betas"
    assert zero["rollbacks"] == one["rollbacks"], "ranks rolled back differently"
    assert zero["rollbacks"], "the hack seen by rank 1 alone did not lead to a rollback"
    step = str(zero["rollbacks"][0]["step"])
    assert zero["after_rollback"][step] == one["after_rollback"][step] == zero["checkpoint"]
    assert zero["final"] == one["final"], "parameters differ across ranks"


def test_grpo_ranks_take_one_decision(tmp_path):
    args = ("nosync",) if os.environ.get("LOOPGUARD_TEST_NOSYNC") == "1" else ()
    results = launch("grpo_rank_worker.py", tmp_path, *args)
    check_invariants(results)
    steps = results[0]["steps"]
    # rank 0's data stayed healthy, yet it raised beta and rolled back with rank 1
    assert steps["8"]["action"] == "rollback"
    assert steps["8"]["beta"] > steps["1"]["beta"]
    # the run identity's 2-part broadcast at the start, then one flag reduce per step, plus severity reduce
    # and a 2-part broadcast per observed step, plus the rollback's 2 barriers and its success check: the same
    # count on both ranks
    assert results[0]["collectives"] == results[1]["collectives"] == 2 + 8 * 4 + 3
    # the generation step's padded ids are all-gathered: both ranks hold all 16 rows, the same ones, and
    # their token count matches TRL's own gathered completion-length metric at every step
    zero, one = results
    assert zero["ids"] == one["ids"]
    assert sorted(zero["ids"], key=int) == [str(step) for step in range(1, 9)]
    for step, read in zero["ids"].items():
        assert read["rows"] == 16  # 8 completions per rank, 2 ranks
        assert read["tokens"] / read["rows"] == pytest.approx(zero["trl_mean_length"][step])


def test_without_the_reduction_the_ranks_diverge(tmp_path):
    """Negative control: the same run with RankSync disabled breaks the invariants the test above checks."""
    results = launch("grpo_rank_worker.py", tmp_path, "nosync")
    assert results[0]["collectives"] == results[1]["collectives"] == 0
    with pytest.raises(AssertionError):
        check_invariants(results)


def test_single_process_issues_no_collective(monkeypatch):
    import torch.distributed as dist

    def refuse(*args, **kwargs):
        raise AssertionError("a collective was called in a single process")

    for name in ("all_reduce", "broadcast", "barrier", "all_gather", "broadcast_object_list"):
        monkeypatch.setattr(dist, name, refuse)
    sync = RankSync()
    assert not sync.active
    guard, twin = Guard(mode="log_only", warmup_steps=3), Guard(mode="log_only", warmup_steps=3)
    for step in range(5):
        observation = Observation(step, [1.0, 0.0, 0.5, 0.25])
        decision = synced_step(guard, observation, can_rollback=True, sync=sync)
        assert decision == twin.step(observation)
    assert synced_step(guard, None, can_rollback=True, sync=sync) is None
    assert sync.reduce([2.0, 4.0], "mean") == [2.0, 4.0]
    assert sync.any(True)
    assert not sync.all(False)
    sync.barrier()
    assert synced_restore(sync, lambda discard: discard, main=True) is True
    assert sync.broadcast_json({"a": [1, 2.5]}, src=0) == {"a": [1, 2.5]}
    assert sync.collectives == 0


def test_single_process_grpo_mitigator_issues_no_collective(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[1] / "adapters"))
    import torch
    import torch.distributed as dist
    from adapter_helpers import build_tokenizer, grpo_trainer, make_echo_reward, save_tiny_model

    from loopguard import EscalationLadder, RewardHackMitigator

    def refuse(*args, **kwargs):
        raise AssertionError("a collective was called in a single process")

    for name in ("all_reduce", "broadcast", "barrier"):
        monkeypatch.setattr(dist, name, refuse)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer = build_tokenizer()
        model_dir = save_tiny_model(tmp_path / "model", tokenizer)
        mitigator = RewardHackMitigator(
            guard=Guard(ladder=EscalationLadder(), warmup_steps=3), checkpoint=tmp_path / "store"
        )
        trainer = grpo_trainer(
            model_dir, tokenizer, tmp_path / "run", [make_echo_reward(2)], [mitigator], max_steps=4
        )
        with warnings.catch_warnings(record=True) as caught:  # the mitigator turns its errors into warnings
            warnings.simplefilter("always")
            trainer.train()
    finally:
        torch.set_num_threads(threads)
    assert mitigator.last_decision is not None
    assert mitigator.last_decision.step == 4
    assert mitigator._sync.collectives == 0
    assert not [w for w in caught if "collective" in str(w.message) or "loopguard" in str(w.message)]


def test_severity_orders_verdict_then_action_then_vote():
    guard = Guard(mode="log_only", warmup_steps=3)
    decision = guard.step(Observation(0, [1.0, 0.0]))
    calm = severity(decision)
    worse = decision_from_dict({**decision.to_dict(), "verdict": "WARN", "action": "lower_beta"})
    hack = decision_from_dict({**decision.to_dict(), "verdict": "HACK", "action": "none", "vote": 0.4})
    rollback = decision_from_dict({**hack.to_dict(), "action": "rollback", "vote": 0.3})
    assert calm < severity(worse) < severity(hack) < severity(rollback)
