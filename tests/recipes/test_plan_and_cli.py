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


def test_cli_plan_only_lists_the_trl_options_and_imports_neither_torch_nor_trl(tmp_path):
    # TRL's own syntax (HfArgumentParser) beside loopguard's options; --plan-only cannot check them (that
    # needs TRL), so it lists them, and loads nothing heavy
    code = (
        "import sys\n"
        "from loopguard.cli import main\n"
        "status = main(['iterative-dpo', '--plan-only', '--output_dir', sys.argv[1], '--rounds', '1',\n"
        "               '--learning_rate', '1e-6', '--per_device_train_batch_size', '2', '--use_cpu'])\n"
        "print(status, sorted(m for m in ('torch', 'trl', 'transformers') if m in sys.modules))\n"
    )
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", code, str(run)], capture_output=True, text=True, check=True, timeout=120
    )
    lines = done.stdout.splitlines()
    assert lines[0] == f"iterative DPO plan: 1 round(s) in {run}"
    assert lines[-2] == (
        "  trl.DPOConfig options, checked when the run starts: --learning_rate 1e-6 "
        "--per_device_train_batch_size 2 --use_cpu"
    )
    assert lines[-1] == "0 []"
    assert not run.exists()


def test_cli_config_file_gives_options_and_the_command_line_wins(tmp_path, capsys):
    config = tmp_path / "idpo.yaml"
    config.write_text(
        f"output_dir: {tmp_path / 'run'}\nrounds: 3\nbeta: 0.2\nsamples_per_prompt: 6\nmax_steps: 5\n"
    )
    assert main(["iterative-dpo", "--plan-only", "--config", str(config), "--rounds", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"iterative DPO plan: 2 round(s) in {tmp_path / 'run'}"
    assert out[1].startswith("  K=6 samples per prompt")
    assert out[1].endswith("DPO beta 0.2")
    assert out[-1] == "  trl.DPOConfig options, checked when the run starts: max_steps=5 (--config)"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["--dpo-arg", "learning_rate=1e-6", "--dpo-arg=use_cpu=true"],
            "`--dpo-arg` was removed: pass trl.DPOConfig fields the way TRL's scripts take them, e.g. "
            "--learning_rate 1e-6 --use_cpu true (see `loopguard iterative-dpo --help`).",
        ),
        (
            ["--rounds", "1"],
            "`loopguard iterative-dpo` needs --output-dir (on the command line or in --config), got none.",
        ),
        (
            ["--output-dir", "x"],
            "`loopguard iterative-dpo` needs --rounds (on the command line or in --config), got none.",
        ),
    ],
)
def test_cli_plan_only_errors_name_the_option(tmp_path, capsys, argv, error):
    base = (
        []
        if "--rounds" in argv or "--output-dir" in argv
        else ["--output-dir", str(tmp_path / "run"), "--rounds", "1"]
    )
    assert main(["iterative-dpo", "--plan-only", *base, *argv]) == 2
    assert capsys.readouterr().err == f"loopguard: error: {error}\n"


@pytest.mark.parametrize(
    ("trl_options", "config", "error"),
    [
        (
            ["--learning_rate", "abc"],
            None,
            "`--learning_rate` (a trl.DPOConfig field): invalid float value: 'abc'.",
        ),
        (
            ["--lr_scheduler_type", "sometimes"],
            None,
            "`--lr_scheduler_type` (a trl.DPOConfig field): invalid choice: 'sometimes'",
        ),
        (
            ["--learnin_rate", "1e-6"],
            None,
            "`loopguard iterative-dpo` options must be its own or trl.DPOConfig fields (see --help), got an "
            "unknown option: '--learnin_rate'.",
        ),
        (
            ["--use_cpu", "--fp16", "true", "--bf16", "true"],
            None,
            "the trl.DPOConfig options must make a trl.DPOConfig that TRL accepts, got --use_cpu True --fp16 True "
            "--bf16 True, which it refuses: At most one of fp16 and bf16 can be True, but not both",
        ),
        (
            [],
            "learning_rat: 0.1\n",
            "`--config` keys must be options of `loopguard iterative-dpo` or trl.DPOConfig fields, got "
            "'learning_rat'.",
        ),
        (
            ["--dpo_arg", "max_steps=1"],
            None,
            "`--dpo-arg` was removed: pass trl.DPOConfig fields the way TRL's",
        ),
    ],
)
def test_cli_bad_trl_options_fail_before_any_model_loads(tmp_path, capsys, trl_options, config, error):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2 \n")
    extra = []
    if config is not None:
        (tmp_path / "c.yaml").write_text(config)
        extra = ["--config", str(tmp_path / "c.yaml")]
    output_dir = tmp_path / "run"
    argv = [
        "iterative-dpo",
        *("--policy", str(tmp_path / "no-policy"), "--reward-model", str(tmp_path / "no-reward")),
        *("--prompts", str(prompts), "--output-dir", str(output_dir), "--rounds", "1"),
        *extra,
        *trl_options,
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"loopguard: error: {error}")
    assert err.count("\n") == 1
    assert not output_dir.exists()


def test_cli_runs_a_round_from_saved_models(tmp_path, tokenizer, policy_dir, capsys, monkeypatch):
    reward_dir = tmp_path / "reward"
    tiny_reward_model(tokenizer).save_pretrained(reward_dir)
    tokenizer.save_pretrained(reward_dir)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:4]))
    config = tmp_path / "dpo.yaml"  # TRL's --config format: options, DPOConfig fields and an env mapping
    config.write_text(
        "max_new_tokens: 4\nmax_length: 16\nlearning_rate: 1.0\nenv:\n  LOOPGUARD_TEST_CONFIG_ENV: from-yaml\n"
    )
    monkeypatch.setenv("LOOPGUARD_TEST_CONFIG_ENV", "unset")  # restored after the test
    output_dir = tmp_path / "run"
    status = main(
        [
            "iterative-dpo",
            *("--policy", policy_dir, "--prompts", str(prompts), "--reward-model", str(reward_dir)),
            *("--output-dir", str(output_dir), "--rounds", "1", "--max-failed-rounds", "1"),
            *("--config", str(config)),
            # TRL's own syntax, as `trl dpo` takes it (the command line wins over --config's learning_rate)
            *("--use_cpu", "--bf16", "false", "--max_steps", "1", "--per_device_train_batch_size", "4"),
            *("--learning_rate", "0.003", "--lr_scheduler_type", "constant"),
        ]
    )
    out = capsys.readouterr().out
    manifest = json.loads((output_dir / "manifest.json").read_text())
    assert [r["round"] for r in manifest["rounds"]] == [1]
    assert status == (1 if manifest["stopped"] else 0)
    assert out.splitlines()[-1] == manifest["explanation"]
    assert manifest["rounds"][0]["reference"] == policy_dir  # a folder outside output_dir is used in place
    assert (output_dir / "round-01" / "pairs.jsonl").exists()
    metrics = json.loads((output_dir / "round-01" / "metrics.json").read_text())
    assert metrics["dpo_config"] == {  # what the round's DPOConfig held: the options given, beta and seed
        "beta": 0.1,
        "bf16": False,
        "learning_rate": 0.003,
        "lr_scheduler_type": "constant",
        "max_length": 16,
        "max_steps": 1,
        "per_device_train_batch_size": 4,
        "seed": 1,
        "use_cpu": True,
    }
    assert metrics["train"]["steps"] == 1
    assert os.environ["LOOPGUARD_TEST_CONFIG_ENV"] == "from-yaml"
