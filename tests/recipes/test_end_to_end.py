"""A real iterative DPO run on a tiny GPT-2 on CPU: pairs, reference chaining, resume, reward-model batching."""

import json
import os

import pytest
from recipe_helpers import PROMPTS, dpo_args, low_words, same_weights, state, tiny_policy, tiny_reward_model
from transformers import AutoModelForCausalLM

from loopguard.exceptions import ConfigError, LoopguardTypeError
from loopguard.recipes import IterativeDPO
from loopguard.recipes.iterative_dpo import _fingerprint


def _read_json(path):
    with open(path) as handle:
        return json.load(handle)


def _recipe(tokenizer, output_dir, reward=low_words, rounds=2, **kwargs):
    kwargs.setdefault("dpo_args", dpo_args())
    kwargs.setdefault("max_new_tokens", 6)
    return IterativeDPO(
        tiny_policy(tokenizer), tokenizer, PROMPTS, reward, rounds=rounds, output_dir=output_dir, **kwargs
    )


class CountingReward:
    def __init__(self):
        self.calls = 0

    def __call__(self, prompts, completions):
        self.calls += 1
        return low_words(prompts, completions)


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory, tokenizer):
    output_dir = tmp_path_factory.mktemp("idpo-e2e")
    result = _recipe(tokenizer, output_dir).run()
    return str(output_dir), result


def test_two_rounds_write_pairs_metrics_models_and_manifest(two_rounds):
    output_dir, result = two_rounds
    assert [r["promoted"] for r in result.rounds] == [True, True]
    assert not result.stopped
    assert result.policy == os.path.join(output_dir, "round-02", "model")
    for number in (1, 2):
        folder = os.path.join(output_dir, f"round-{number:02d}")
        with open(os.path.join(folder, "pairs.jsonl")) as handle:
            pairs = [json.loads(line) for line in handle]
        assert 1 <= len(pairs) <= len(PROMPTS)
        for pair in pairs:
            assert pair["prompt"] in PROMPTS
            assert pair["chosen_reward"] > pair["rejected_reward"]
            assert pair["margin"] == pytest.approx(pair["chosen_reward"] - pair["rejected_reward"])
        metrics = _read_json(os.path.join(folder, "metrics.json"))
        assert metrics["pairs"]["count"] == len(pairs)
        assert metrics["pairs"]["count"] + metrics["pairs"]["dropped_ties"] == len(PROMPTS)
        assert metrics["train"]["steps"] == 3
        assert metrics["promoted"] is True
        assert metrics["reasons"] == []
        assert {gate["name"] for gate in metrics["gates"]} == {
            "length_correlation",
            "repetition",
            "reward_drift",
        }
        assert os.path.isfile(os.path.join(folder, "model", "config.json"))
    manifest = _read_json(os.path.join(output_dir, "manifest.json"))
    assert [r["round"] for r in manifest["rounds"]] == [1, 2]
    assert manifest["policy"] == "round-02/model"
    assert not [name for name in os.listdir(output_dir) if ".tmp-" in name]


def test_reference_is_refreshed_to_the_previous_promoted_policy(two_rounds):
    output_dir, _ = two_rounds
    first = _read_json(os.path.join(output_dir, "round-01", "metrics.json"))
    second = _read_json(os.path.join(output_dir, "round-02", "metrics.json"))
    assert first["reference"] == "initial/model"
    assert second["reference"] == second["policy_from"] == "round-01/model"
    # the fingerprint is taken from trainer.ref_model after training: the round-2 reference IS round 1's policy
    round1 = AutoModelForCausalLM.from_pretrained(os.path.join(output_dir, "round-01", "model"))
    initial = AutoModelForCausalLM.from_pretrained(os.path.join(output_dir, "initial", "model"))
    assert second["weights"]["reference_fingerprint"] == first["weights"]["candidate_fingerprint"]
    assert second["weights"]["reference_fingerprint"] == _fingerprint(round1)
    assert first["weights"]["reference_fingerprint"] == _fingerprint(initial)


def test_the_policy_changes_every_round(two_rounds):
    output_dir, _ = two_rounds
    weights = [
        state(os.path.join(output_dir, *parts))
        for parts in (("initial", "model"), ("round-01", "model"), ("round-02", "model"))
    ]
    assert not same_weights(weights[0], weights[1])
    assert not same_weights(weights[1], weights[2])


def test_resume_skips_finished_rounds(tmp_path, tokenizer):
    first = CountingReward()
    _recipe(tokenizer, tmp_path, reward=first, rounds=1).run()
    assert first.calls == 2  # round 1: its samples and its candidate's audit samples
    metrics_path = tmp_path / "round-01" / "metrics.json"
    stamp = os.stat(metrics_path).st_mtime_ns
    pairs = (tmp_path / "round-01" / "pairs.jsonl").read_bytes()

    second = CountingReward()
    result = _recipe(tokenizer, tmp_path, reward=second, rounds=2).run()
    assert second.calls == 2  # only round 2 ran
    assert os.stat(metrics_path).st_mtime_ns == stamp
    assert (tmp_path / "round-01" / "pairs.jsonl").read_bytes() == pairs
    assert [r["round"] for r in result.rounds] == [1, 2]
    assert result.rounds[1]["reference"] == "round-01/model"

    third = CountingReward()
    again = _recipe(tokenizer, tmp_path, reward=third, rounds=2).run()
    assert third.calls == 0
    assert again.rounds == result.rounds


def test_resume_refuses_changed_settings(tmp_path, tokenizer):
    _recipe(tokenizer, tmp_path, rounds=1, dpo_args=dpo_args(max_steps=1)).run()
    message = (
        "`output_dir` must hold a run made with the same settings to resume, got a manifest whose pairing, "
        "samples_per_prompt differ; use a new output_dir or the recorded settings."
    )
    with pytest.raises(ConfigError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
        _recipe(tokenizer, tmp_path, rounds=2, pairing="max_max", samples_per_prompt=3).run()


def test_reward_model_is_scored_in_batches_and_never_reloaded(tmp_path, tokenizer):
    reward_model = tiny_reward_model(tokenizer)
    calls = []
    reward_model.register_forward_hook(lambda module, inputs, output: calls.append(output.logits.shape[0]))
    recipe = _recipe(
        tokenizer,
        tmp_path,
        reward=reward_model,
        rounds=1,
        reward_tokenizer=tokenizer,
        reward_batch_size=10,
        pairs_per_round=3,
    )
    recipe.run()
    # 8 prompts x 4 samples = 32 completions per scoring pass, twice (samples, audit): 10 + 10 + 10 + 2, twice
    assert calls == [10, 10, 10, 2, 10, 10, 10, 2]
    metrics = json.loads((tmp_path / "round-01" / "metrics.json").read_text())
    assert metrics["samples"]["count"] == 32
    assert metrics["samples"]["reward"]["std"] > 0
    # the cap keeps the 3 pairs with the largest margins
    assert metrics["pairs"]["count"] == 3
    assert metrics["pairs"]["dropped_over_cap"] == len(PROMPTS) - metrics["pairs"]["dropped_ties"] - 3
    assert len((tmp_path / "round-01" / "pairs.jsonl").read_text().splitlines()) == 3


def test_resume_refuses_a_different_starting_policy(tmp_path, tokenizer):
    _recipe(tokenizer, tmp_path, rounds=1, dpo_args=dpo_args(max_steps=1)).run()
    other = IterativeDPO(
        tiny_policy(tokenizer, seed=7),
        tokenizer,
        PROMPTS,
        low_words,
        rounds=2,
        output_dir=tmp_path,
        dpo_args=dpo_args(max_steps=1),
        max_new_tokens=6,
    )
    with pytest.raises(
        ConfigError,
        match=r"^`policy` must be the policy this run started from to resume, got a different initial_fingerprint",
    ):
        other.run()


def test_lora_rounds_save_the_adapter_and_chain_the_merged_policy(tmp_path, tokenizer):
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0, task_type="CAUSAL_LM"
    )
    result = _recipe(tokenizer, tmp_path, rounds=2, peft_config=lora, dpo_args=dpo_args(max_steps=2)).run()
    assert [r["round"] for r in result.rounds] == [1, 2]
    first = _read_json(tmp_path / "round-01" / "metrics.json")
    second = _read_json(tmp_path / "round-02" / "metrics.json")
    assert (tmp_path / "round-01" / "adapter" / "adapter_config.json").is_file()
    assert first["adapter"] == "round-01/adapter"
    # round 2 trains a new adapter on round 1's merged policy, which is also its reference
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "round-01" / "model")
    assert (
        second["weights"]["reference_fingerprint"]
        == _fingerprint(merged)
        == first["weights"]["candidate_fingerprint"]
    )
    assert not same_weights(state(tmp_path / "initial" / "model"), state(tmp_path / "round-01" / "model"))
    manifest = _read_json(tmp_path / "manifest.json")
    assert manifest["settings"]["peft"]["r"] == 4
    assert lora.base_model_name_or_path is None  # the caller's config is not mutated
    # resuming with the same LoRA config is accepted (nothing left to run)
    again = _recipe(tokenizer, tmp_path, rounds=2, peft_config=lora, dpo_args=dpo_args(max_steps=2)).run()
    assert again.rounds == result.rounds
    with pytest.raises(
        LoopguardTypeError, match=r"^`peft_config` must be a peft.PeftConfig \(LoraConfig, ...\), got dict.$"
    ):
        _recipe(tokenizer, tmp_path, peft_config={"r": 4})
