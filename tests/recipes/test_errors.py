"""Bad arguments fail at construction with the argument, the rule and the value in the message."""

import json
import re

import pytest
from recipe_helpers import PROMPTS, low_words, tiny_policy, tiny_reward_model

from loopguard._saved_state import write_atomic as _write_atomic
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError
from loopguard.recipes import IterativeDPO, IterativeDPOConfig, SafetyGates


def _exact(message):
    return f"^{re.escape(message)}$"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rounds": 0}, ConfigError, "`rounds` must be in [1, 100], got 0."),
        ({"rounds": 101}, ConfigError, "`rounds` must be in [1, 100], got 101."),
        ({"rounds": True}, LoopguardTypeError, "`rounds` must be an integer (not bool), got True."),
        ({"rounds": 2.0}, LoopguardTypeError, "`rounds` must be an integer, got 2.0 of type float."),
        ({"pairs_per_round": 0}, ConfigError, "`pairs_per_round` must be in [1, 1000000], got 0."),
        (
            {"pairs_per_round": 1_000_001},
            ConfigError,
            "`pairs_per_round` must be in [1, 1000000], got 1000001.",
        ),
        ({"samples_per_prompt": 1}, ConfigError, "`samples_per_prompt` must be in [2, 256], got 1."),
        (
            {"pairing": "best_worst"},
            ConfigError,
            "`pairing` must be one of 'length_penalized', 'max_max', 'max_min', 'max_random', got 'best_worst'.",
        ),
        ({"pairing": True}, LoopguardTypeError, "`pairing` must be a name string, got True of type bool."),
        ({"beta": float("nan")}, ConfigError, "`beta` must be finite, got nan."),
        ({"beta": 0.0}, ConfigError, "`beta` must be > 0, got 0.0."),
        (
            {"temperature": False},
            LoopguardTypeError,
            "`temperature` must be a real number (not bool), got False.",
        ),
        ({"max_failed_rounds": 0}, ConfigError, "`max_failed_rounds` must be in [1, 100], got 0."),
        (
            {"output_dir": "runs/\x00x"},
            ConfigError,
            "`output_dir` must not contain null bytes, got 'runs/\\x00x'.",
        ),
        ({"output_dir": ""}, ConfigError, "`output_dir` must be a non-empty path string, got ''."),
        (
            {"output_dir": b"runs"},
            LoopguardTypeError,
            "`output_dir` must be a str or os.PathLike path, got bytes b'runs'.",
        ),
        (
            {"gates": {"max_repetition": 0.3}},
            LoopguardTypeError,
            "`gates` must be a SafetyGates, got {'max_repetition': 0.3} of type dict.",
        ),
    ],
)
def test_config_errors(kwargs, error, message):
    values = {"output_dir": "runs/x", "rounds": 2, **kwargs}
    with pytest.raises(error, match=_exact(message)):
        IterativeDPOConfig(**values)


def test_gate_threshold_errors():
    with pytest.raises(ConfigError, match=_exact("`max_length_correlation` must be in [-1, 1], got 1.5.")):
        SafetyGates(max_length_correlation=1.5)
    with pytest.raises(ConfigError, match=_exact("`max_gold_drop` must be > 0, got 0.0.")):
        SafetyGates(max_gold_drop=0.0)
    with pytest.raises(ConfigError, match=_exact("`max_disagreement_ratio` must be >= 1, got 0.5.")):
        SafetyGates(max_disagreement_ratio=0.5)


@pytest.fixture
def make(tokenizer, tmp_path):
    def build(policy=None, prompts=PROMPTS, reward=low_words, **kwargs):
        kwargs.setdefault("rounds", 1)
        kwargs.setdefault("output_dir", tmp_path / "run")
        return IterativeDPO(
            tiny_policy(tokenizer) if policy is None else policy, tokenizer, prompts, reward, **kwargs
        )

    return build


def test_recipe_argument_errors(make, tokenizer, tmp_path):
    cases = [
        (dict(rounds=200), ConfigError, "`rounds` must be in [1, 100], got 200."),
        (dict(prompts=[]), InputError, "`prompts` must hold 1 to 100,000 prompts, got 0."),
        (
            dict(prompts="w1 w2 "),
            LoopguardTypeError,
            "`prompts` must be a sequence of strings, got str 'w1 w2 '.",
        ),
        (dict(prompts=["w1 ", ""]), ConfigError, "`prompts[1]` must be a non-empty string, got ''."),
        (
            dict(reward=3),
            LoopguardTypeError,
            "`reward` must be a callable or an nn.Module reward model, got int.",
        ),
        (
            dict(reward=tiny_reward_model(tokenizer)),
            LoopguardTypeError,
            "`reward_tokenizer` must be the reward model's transformers tokenizer when `reward` is an nn.Module, "
            "got NoneType.",
        ),
        (
            dict(policy=42),
            LoopguardTypeError,
            "`policy` must be a transformers PreTrainedModel or a folder, got int.",
        ),
        (
            dict(policy=str(tmp_path / "missing")),
            ConfigError,
            f"`policy` must be a model or the folder of a saved one, got '{tmp_path / 'missing'}'.",
        ),
        (dict(ensemble=[low_words]), ConfigError, "`ensemble` must hold 2 to 32 scorers, got 1."),
        (
            dict(gold="gold"),
            LoopguardTypeError,
            "`gold` must be a callable fn(prompts, completions) -> scores, got str.",
        ),
        (
            dict(dpo_args={"beta": 0.2}),
            ConfigError,
            "`dpo_args` must not set 'beta' (the recipe sets it: pass beta= / output_dir= to IterativeDPO), got 'beta'.",
        ),
        (
            dict(dpo_args={"learning_rat": 1e-5}),
            ConfigError,
            "`dpo_args` must name DPOConfig fields, got 'learning_rat'.",
        ),
        (
            dict(kl_coef=0.1),
            LoopguardTypeError,
            "IterativeDPO got unknown setting(s) kl_coef; see IterativeDPOConfig.",
        ),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=_exact(message)):
            make(**kwargs)
    assert not (tmp_path / "run").exists()


def test_corrupt_or_symlinked_manifest_is_refused(make, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="must be a readable JSON manifest"):
        make().run()
    (run / "manifest.json").write_text(json.dumps({"schema": 9, "rounds": []}))
    with pytest.raises(InputError, match=re.escape("must have schema <= 1, got 9.")):
        make().run()
    (run / "manifest.json").unlink()
    (tmp_path / "elsewhere.json").write_text("{}")
    (run / "manifest.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(InputError, match="must be a regular file"):
        make().plan()


def test_atomic_write_replaces_whole_files_and_leaves_no_temp(tmp_path):
    target = tmp_path / "manifest.json"
    _write_atomic(str(target), b"one")
    _write_atomic(str(target), b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]
