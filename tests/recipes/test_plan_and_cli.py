"""plan() and `loopguard iterative-dpo --plan-only` write nothing; the CLI runs a real round end to end."""

import json
import os
import subprocess
import sys

import attrs
import pytest
from recipe_helpers import PROMPTS, low_words, tiny_policy, tiny_reward_model

from loopguard.cli import main
from loopguard.recipes import IterativeDPO, IterativeDPOConfig


def _tree(folder):
    return sorted(
        os.path.relpath(os.path.join(root, name), folder)
        for root, dirs, files in os.walk(folder)
        for name in dirs + files
    )


def test_plan_lists_per_round_paths_and_writes_nothing(tmp_path, tokenizer):
    output_dir = tmp_path / "run"
    recipe = IterativeDPO(
        tiny_policy(tokenizer),
        tokenizer,
        PROMPTS,
        low_words,
        rounds=3,
        output_dir=output_dir,
        prompts_per_round=5,
    )
    plan = recipe.plan()
    assert not output_dir.exists()
    assert _tree(tmp_path) == []
    root = str(output_dir)
    assert plan.initial_policy == os.path.join(root, "initial", "model")
    assert [(p.round, p.first_prompt, p.num_prompts) for p in plan.rounds] == [
        (1, 0, 5),
        (2, 5, 5),
        (3, 2, 5),
    ]
    assert plan.rounds[0].reference == plan.initial_policy
    assert plan.rounds[1].policy_from == plan.rounds[1].reference == os.path.join(root, "round-01", "model")
    assert plan.rounds[2].pairs_path == os.path.join(root, "round-03", "pairs.jsonl")
    assert plan.rounds[2].metrics_path == os.path.join(root, "round-03", "metrics.json")
    assert plan.finished_rounds == ()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        plan.rounds[0].round = 5


def test_plan_reports_finished_rounds_from_an_existing_manifest(tmp_path):
    manifest = {"schema": 1, "settings": None, "rounds": [{"round": 1}, {"round": 2}], "stopped": False}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    before = _tree(tmp_path)
    plan = IterativeDPOConfig(output_dir=tmp_path, rounds=3).plan(initial_policy="sft")
    assert plan.finished_rounds == (1, 2)
    assert "(finished rounds: 1, 2)" in plan.to_text()
    assert _tree(tmp_path) == before


def test_cli_plan_only_prints_the_plan_and_exits_0(tmp_path, capsys):
    output_dir = tmp_path / "run"
    status = main(
        [
            "iterative-dpo",
            "--plan-only",
            "--output-dir",
            str(output_dir),
            "--rounds",
            "2",
            "--policy",
            "models/sft",
            "--pairing",
            "max_random",
            "--samples-per-prompt",
            "6",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    assert out[0] == f"iterative DPO plan: 2 round(s) in {output_dir}"
    assert (
        out[1]
        == "  K=6 samples per prompt, pairing max_random, pairs per round: one per prompt, DPO beta 0.1"
    )
    assert out[4] == "  round 01: policy models/sft, prompts all"
    assert out[7] == f"  round 02: policy {output_dir}/round-01/model, prompts all"
    assert out[8] == f"    reference {output_dir}/round-01/model"
    assert not output_dir.exists()


def test_cli_rejects_bad_arguments_with_the_rule(tmp_path, capsys):
    assert main(["iterative-dpo", "--plan-only", "--output-dir", str(tmp_path), "--rounds", "101"]) == 2
    assert capsys.readouterr().err == "loopguard: error: `rounds` must be in [1, 100], got 101.\n"
    assert main(["iterative-dpo", "--output-dir", str(tmp_path), "--rounds", "1"]) == 2
    assert capsys.readouterr().err == (
        "loopguard: error: `loopguard iterative-dpo` needs --policy, --prompts, --reward-model to run "
        "(or --plan-only), got none.\n"
    )


def test_cli_and_recipes_import_without_torch():
    code = "import sys, loopguard.cli, loopguard.recipes; print(sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_runs_a_round_from_saved_models(tmp_path, tokenizer, policy_dir, capsys):
    reward_dir = tmp_path / "reward"
    tiny_reward_model(tokenizer).save_pretrained(reward_dir)
    tokenizer.save_pretrained(reward_dir)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:4]))
    output_dir = tmp_path / "run"
    status = main(
        [
            "iterative-dpo",
            "--policy",
            policy_dir,
            "--prompts",
            str(prompts),
            "--reward-model",
            str(reward_dir),
            "--output-dir",
            str(output_dir),
            "--rounds",
            "1",
            "--max-new-tokens",
            "4",
            "--max-failed-rounds",
            "1",
            "--dpo-arg",
            "use_cpu=true",
            "--dpo-arg",
            "bf16=false",
            "--dpo-arg",
            "max_steps=1",
            "--dpo-arg",
            "per_device_train_batch_size=4",
            "--dpo-arg",
            "max_length=16",
        ]
    )
    out = capsys.readouterr().out
    manifest = json.loads((output_dir / "manifest.json").read_text())
    assert [r["round"] for r in manifest["rounds"]] == [1]
    assert status == (1 if manifest["stopped"] else 0)
    assert out.splitlines()[-1] == manifest["explanation"]
    assert manifest["rounds"][0]["reference"] == policy_dir  # a folder outside output_dir is used in place
    assert (output_dir / "round-01" / "pairs.jsonl").exists()
