"""The ``loopguard`` console script.

Subcommands:

* ``loopguard --version`` prints the installed version.
* ``loopguard iterative-dpo --plan-only --output-dir DIR --rounds N [...]`` prints the plan of an iterative
  DPO run (per-round folders, policy and reference of each round, gates) and writes nothing.
* ``loopguard iterative-dpo --policy DIR --prompts FILE --reward-model DIR --output-dir DIR --rounds N
  [--learning_rate 1e-6 --per_device_train_batch_size 2 ...] [--config FILE.yaml]`` runs it: the policy and
  the reward model (``num_labels=1``) are folders saved with ``save_pretrained`` (tokenizers included);
  prompts are a ``.jsonl`` file with a ``"prompt"`` field, or a text file with one prompt per line. Rerunning
  resumes after the last finished round. loopguard's own options are :class:`IterativeDPOArguments`; every
  other option is a ``trl.DPOConfig`` field, parsed the way TRL's scripts parse it (``HfArgumentParser``),
  and ``--config`` reads both kinds from YAML as TRL's ``--config`` does (the command line wins).
  ``--output-dir``, ``--beta`` and ``--seed`` are loopguard's and win over the ``DPOConfig`` fields of the
  same names: the recipe sets each round's ``output_dir`` (``<output-dir>/round-NN/trainer``), ``beta`` and
  ``seed`` (``seed + N``) from them. ``--dpo-arg KEY=VALUE`` was removed (an error says what to write).
* ``loopguard report LOG [-o OUT.png|OUT.html] [--skip-corrupt] [--run ID]`` prints a plain-English summary
  of a mitigation log (what tripped and when, every action, the outcome), run by run when several runs
  appended to it; with ``-o`` it also draws one run (``--run``, default the newest) -- beta, the vote and
  each signal's score over steps -- to a PNG, or to an HTML page with the summary and the actions'
  explanations (needs the ``plot`` extra: matplotlib). Only ``LOG`` itself is read, not its rotated files.

``import loopguard.cli`` is light, and each command imports only what it uses: ``report`` imports neither
numpy, scipy, scikit-learn nor torch for its text summary (matplotlib only with ``-o``), ``iterative-dpo
--plan-only`` neither torch nor TRL; torch, transformers and TRL load only for a run that trains.

Example:
    >>> from loopguard.cli import main
    >>> main(["iterative-dpo", "--plan-only", "--output-dir", "runs/x", "--rounds", "1", "--policy", "sft"])
    iterative DPO plan: 1 round(s) in runs/x
    ...
    0
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import typing
from collections.abc import Sequence
from typing import Any

from loopguard._validation import check_bool, check_path, describe, import_extra
from loopguard.exceptions import ConfigError, LoopguardError

__all__ = ["main"]

_MAX_PROMPT_FILE_BYTES = 1 << 30
_MAX_CONFIG_FILE_BYTES = 1 << 20


def _version() -> str:
    """``loopguard <version>``: the installed distribution's version (``loopguard.__version__`` reads it)."""
    import loopguard

    return f"loopguard {loopguard.__version__}"


class _VersionAction(argparse.Action):
    """``--version``: print the version and exit 0 (read only when asked: importlib.metadata costs ~10 ms)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        print(_version())
        parser.exit()


def _option(default: Any, text: str) -> Any:
    return dataclasses.field(default=default, metadata={"help": text})


@dataclasses.dataclass
class IterativeDPOArguments:
    """The options of ``loopguard iterative-dpo`` that are loopguard's; the others are ``DPOConfig`` fields.

    Each field is an option in both spellings (``--reward-model`` and ``--reward_model``) and a key of a
    ``--config`` YAML file. ``output_dir``, ``beta`` and ``seed`` are ``DPOConfig`` fields too: these options
    win, and the recipe sets each round's ``DPOConfig`` from them (``output_dir``: the run folder, round ``N``
    trains in ``<output_dir>/round-NN/trainer``; ``beta``: every round's; ``seed``: round ``N`` trains with
    ``seed + N``).
    """

    output_dir: str | None = _option(
        None,
        "folder of the run (round-NN/, manifest.json); required. Wins over DPOConfig.output_dir, which the "
        "recipe sets to <output-dir>/round-NN/trainer for each round",
    )
    rounds: int | None = _option(None, "number of rounds, 1 to 100; required")
    plan_only: bool = _option(False, "print the plan and exit; write nothing (imports neither torch nor TRL)")
    policy: str | None = _option(None, "folder of the starting policy (save_pretrained format)")
    prompts: str | None = _option(None, "prompts: .jsonl with a 'prompt' field, or one prompt per line")
    reward_model: str | None = _option(
        None, "folder of a sequence-classification reward model (num_labels=1)"
    )
    samples_per_prompt: int = _option(4, "K completions per prompt (>= 2; default 4)")
    pairs_per_round: int | None = _option(None, "cap on pairs per round (default: one per prompt)")
    prompts_per_round: int | None = _option(None, "fresh prompts per round (default: all, every round)")
    pairing: str = _option("max_min", "max_min (default), max_random, max_max or length_penalized")
    beta: float = _option(0.1, "DPO beta of every round (default 0.1); wins over DPOConfig.beta")
    max_new_tokens: int = _option(64, "longest sampled completion, in tokens (default 64)")
    max_failed_rounds: int = _option(2, "stop after this many blocked rounds (default 2)")
    seed: int = _option(
        0, "base seed (default 0): round N samples and trains with seed + N; wins over DPOConfig.seed"
    )


_OWN = tuple(field.name for field in dataclasses.fields(IterativeDPOArguments))
_REMOVED = ("--dpo-arg", "--dpo_arg")
_IDPO_EPILOG = """\
Every other option is a trl.DPOConfig field, given the way TRL's own scripts take it (HfArgumentParser):
--learning_rate 1e-6 --per_device_train_batch_size 2 --max_steps 100 --use_cpu --bf16 false ...
(see TRL's DPOConfig for the list). --config FILE.yaml reads options of both kinds from a YAML mapping
(and an `env:` mapping of environment variables, as TRL's --config does); the command line wins over it.
The recipe sets DPOConfig.output_dir, beta and seed of each round from --output-dir, --beta and --seed, and
otherwise defaults report_to=[], save_strategy=no, logging_steps=1, disable_tqdm, activation checkpointing
off. The DPOConfig fields are checked when the run starts (not with --plan-only, which lists them).
"""


def _add_dataclass_options(parser: argparse.ArgumentParser, arguments: type[Any]) -> None:
    """Add an option per field of ``arguments``, in both spellings, with no default (``--config`` sets it)."""
    hints = typing.get_type_hints(arguments)
    for field in dataclasses.fields(arguments):
        flags = list(dict.fromkeys((f"--{field.name.replace('_', '-')}", f"--{field.name}")))
        kind = hints[field.name]
        options: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS, **field.metadata}
        if kind is bool:
            options["action"] = "store_true"
        else:
            options["type"] = next(t for t in typing.get_args(kind) or (kind,) if t is not type(None))
        parser.add_argument(*flags, **options)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopguard", description="loopguard command-line tools.")
    parser.add_argument("--version", action=_VersionAction, help="print the version of loopguard and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    idpo = commands.add_parser(
        "iterative-dpo",
        help="plan or run iterative DPO with safety gates between rounds",
        description="Iterative DPO: sample K completions per prompt, score, pair, train DPO against the\n"
        "previous round's policy, gate, promote. See docs/iterative_dpo.md.",
        epilog=_IDPO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # an unknown option is a DPOConfig field, never an abbreviation of one of ours
    )
    _add_dataclass_options(idpo, IterativeDPOArguments)
    idpo.add_argument(
        "--config",
        metavar="FILE.yaml",
        default=argparse.SUPPRESS,
        help="read options (these and DPOConfig fields) from a YAML mapping; the command line wins",
    )
    report = commands.add_parser(
        "report",
        help="summarise a mitigation log in plain English; optionally draw it (PNG or HTML)",
        description="Print a plain-English summary of a mitigation log (JSONL); with -o also write a figure "
        "of beta, the vote and the signal scores over steps. See docs/log.md.",
    )
    report.add_argument("log", metavar="LOG", help="the mitigation log, e.g. OUTPUT_DIR/mitigation_log.jsonl")
    report.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="also write OUT: .png (the figure) or .html (figure, summary, actions)",
    )
    report.add_argument(
        "--skip-corrupt", action="store_true", help="skip corrupt lines (with a warning) instead of failing"
    )
    report.add_argument(
        "--run",
        metavar="ID",
        help="only this run of a shared log (default: every run in the text; the newest in the figure)",
    )
    return parser


def _report(args: argparse.Namespace) -> int:
    from loopguard.log import read_mitigation_log
    from loopguard.report import render_report, summarize

    path = args.log
    if os.path.isdir(path):
        msg = f"`LOG` must be a mitigation log file, got the folder {path!r}."
        raise ConfigError(msg)
    try:
        records = read_mitigation_log(path, on_corrupt="skip" if args.skip_corrupt else "raise")
    except FileNotFoundError:
        msg = f"`LOG` must be an existing mitigation log file, got {path!r} (no such file)."
        raise ConfigError(msg) from None
    if not records:
        rotated = (
            f"; its rotated files ({path}.1, ...) are not read: pass one of them"
            if os.path.exists(f"{path}.1")
            else ""
        )
        msg = f"`LOG` must hold at least one record, got an empty mitigation log {path!r}{rotated}."
        raise ConfigError(msg)
    from loopguard.log import split_runs

    summary = summarize(records, run=args.run)
    drawn, note = args.run, ""
    runs = split_runs(records)
    if args.output is not None and drawn is None and len(runs) > 1:
        drawn = next((one.run for one in reversed(runs) if one.records), runs[-1].run)
        note = f" (run {drawn}, the newest of {len(runs)}; --run ID draws another)"
    written = None if args.output is None else render_report(records, args.output, run=drawn)
    print(summary)
    if written is not None:
        print(f"wrote {written}{note}")
    return 0


def _settings(options: IterativeDPOArguments) -> dict[str, Any]:
    return {
        "output_dir": options.output_dir,
        "rounds": options.rounds,
        "samples_per_prompt": options.samples_per_prompt,
        "pairs_per_round": options.pairs_per_round,
        "prompts_per_round": options.prompts_per_round,
        "pairing": options.pairing,
        "beta": options.beta,
        "max_new_tokens": options.max_new_tokens,
        "max_failed_rounds": options.max_failed_rounds,
        "seed": options.seed,
    }


def _removed_dpo_arg(strings: Sequence[str]) -> ConfigError:
    """``--dpo-arg KEY=VALUE`` is gone: say so, with the fields written the way TRL's scripts take them."""
    pairs = []
    for index, item in enumerate(strings):
        flag, sep, value = item.partition("=")
        if flag in _REMOVED:
            pairs.append(value if sep else (strings[index + 1] if index + 1 < len(strings) else ""))
    written = " ".join(f"--{key} {value}" for key, _, value in (pair.partition("=") for pair in pairs) if key)
    msg = (
        "`--dpo-arg` was removed: pass trl.DPOConfig fields the way TRL's scripts take them, e.g. "
        f"{written or '--learning_rate 1e-6'} (see `loopguard iterative-dpo --help`)."
    )
    return ConfigError(msg)


def _read_config(path: str) -> dict[str, Any]:
    """The YAML mapping of ``--config FILE.yaml`` (TRL's ``--config`` format)."""
    (yaml,) = import_extra("`--config` needs PyYAML: pip install pyyaml ({error}).", "yaml")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(_MAX_CONFIG_FILE_BYTES + 1)
    except (OSError, UnicodeDecodeError) as error:
        msg = f"`--config` must be a readable YAML file, got {path!r} ({error})."
        raise ConfigError(msg) from None
    if len(text) > _MAX_CONFIG_FILE_BYTES:
        msg = f"`--config` must be at most {_MAX_CONFIG_FILE_BYTES:,} bytes, got a larger file {path!r}."
        raise ConfigError(msg)
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as error:
        msg = f"`--config` must be valid YAML, got {path!r} ({' '.join(str(error).split())})."
        raise ConfigError(msg) from None
    if values is None:
        return {}
    if not isinstance(values, dict) or not all(isinstance(key, str) for key in values):
        msg = f"`--config` must hold a YAML mapping of options to values, got {describe(values)} in {path!r}."
        raise ConfigError(msg)
    env = values.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(key, str) for key in env):
        msg = (
            f"`--config` key 'env' must map environment variables to values, got {describe(env)} in {path!r}."
        )
        raise ConfigError(msg)
    return values


def _options(
    args: argparse.Namespace, strings: list[str]
) -> tuple[IterativeDPOArguments, dict[str, Any], dict[str, Any]]:
    """Return loopguard's options (defaults < ``--config`` < command line), the file's other values and env.

    ``strings`` are the command-line strings that are not loopguard's options: the DPOConfig fields.
    """
    if any(item.partition("=")[0] in _REMOVED for item in strings):
        raise _removed_dpo_arg(strings)
    file = _read_config(args.config) if "config" in args else {}
    env = file.pop("env", {})
    if "dpo_arg" in file:
        raise _removed_dpo_arg([])
    own = {key: file.pop(key) for key in _OWN if key in file}
    own.update((key, value) for key, value in vars(args).items() if key in _OWN)
    for key in ("policy", "prompts", "reward_model"):
        if own.get(key) is not None:
            check_path(key, own[key])
    if "plan_only" in own:
        check_bool("plan_only", own["plan_only"])
    options = IterativeDPOArguments(**own)
    for flag, value in (("--output-dir", options.output_dir), ("--rounds", options.rounds)):
        if value is None:
            msg = f"`loopguard iterative-dpo` needs {flag} (on the command line or in --config), got none."
            raise ConfigError(msg)
    return options, file, env


def _dpo_args(trl: Any, transformers: Any, strings: list[str], values: dict[str, Any]) -> dict[str, Any]:
    """Return the DPOConfig fields given on the command line and in ``--config``, parsed as TRL's scripts do.

    Only the fields given come back (the recipe fills in its own defaults for the others); a YAML value is
    the field's default, so the command line wins, as with TRL's ``--config``.
    """
    fields = {field.name for field in dataclasses.fields(trl.DPOConfig)}
    unknown = [key for key in values if key not in fields]
    if unknown:
        msg = (
            "`--config` keys must be options of `loopguard iterative-dpo` or trl.DPOConfig fields, got "
            f"{', '.join(map(repr, unknown))}."
        )
        raise ConfigError(msg)
    parser = transformers.HfArgumentParser(
        trl.DPOConfig, prog="loopguard iterative-dpo", allow_abbrev=False, exit_on_error=False
    )
    for action in parser._actions:  # what TRL's --config does to set defaults
        if action.dest in fields:
            action.default = values.get(action.dest, argparse.SUPPRESS)
    try:
        namespace, rest = parser.parse_known_args(strings)
    except argparse.ArgumentError as error:
        flag = (error.argument_name or "?").split("/")[0]
        msg = f"`{flag}` (a trl.DPOConfig field): {error.message}."
        raise ConfigError(msg) from None
    if rest:
        what = "an unknown option" if rest[0].startswith("-") else "a value no option takes"
        msg = (
            "`loopguard iterative-dpo` options must be its own or trl.DPOConfig fields (see --help), got "
            f"{what}: {rest[0]!r}."
        )
        raise ConfigError(msg)
    return dict(vars(namespace))


def _unchecked(strings: Sequence[str], values: dict[str, Any]) -> str:
    written = [*strings, *(f"{key}={value!r} (--config)" for key, value in values.items())]
    return "  trl.DPOConfig options, checked when the run starts: " + " ".join(written)


def _read_prompts(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        text = handle.read(_MAX_PROMPT_FILE_BYTES + 1)
    if len(text) > _MAX_PROMPT_FILE_BYTES:
        msg = f"`--prompts` must be at most {_MAX_PROMPT_FILE_BYTES:,} bytes, got a larger file."
        raise ConfigError(msg)
    lines = [line for line in text.split("\n") if line.strip()]
    if not path.endswith(".jsonl"):
        return lines
    prompts: list[str] = []
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except ValueError as error:
            msg = f"`--prompts` line {number} must be a JSON object, got {line[:60]!r} ({error})."
            raise ConfigError(msg) from error
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            msg = f"`--prompts` line {number} must have a string 'prompt' field, got {line[:60]!r}."
            raise ConfigError(msg)
        prompts.append(record["prompt"])
    return prompts


def _iterative_dpo(args: argparse.Namespace, strings: list[str]) -> int:
    from loopguard.recipes.iterative_dpo import IterativeDPOConfig

    options, dpo_values, env = _options(args, strings)
    settings = _settings(options)
    if options.plan_only:
        config = IterativeDPOConfig(**settings)
        print(config.plan(initial_policy=options.policy).to_text())
        if strings or dpo_values:
            print(_unchecked(strings, dpo_values))
        return 0
    policy, prompts_file, reward_dir = options.policy, options.prompts, options.reward_model
    if policy is None or prompts_file is None or reward_dir is None:
        missing = [flag for flag, value in (("--policy", policy), ("--prompts", prompts_file),
                   ("--reward-model", reward_dir)) if value is None]  # fmt: skip
        msg = f"`loopguard iterative-dpo` needs {', '.join(missing)} to run (or --plan-only), got none."
        raise ConfigError(msg)
    config = IterativeDPOConfig(**settings)  # fail on bad settings before loading any model
    prompts = _read_prompts(prompts_file)
    os.environ.update((key, str(value)) for key, value in env.items())  # before torch, as TRL's --config

    from loopguard.recipes.iterative_dpo import IterativeDPO, _check_dpo_config, _import_stack

    _, transformers, trl, _ = _import_stack()
    dpo_args = _dpo_args(trl, transformers, strings, dpo_values)
    given = " ".join(f"--{key} {value}" for key, value in dpo_args.items()) or "no option"
    _check_dpo_config(trl, dpo_args, config, name="the trl.DPOConfig options", given=given)

    tokenizer = transformers.AutoTokenizer.from_pretrained(policy)
    reward_model = transformers.AutoModelForSequenceClassification.from_pretrained(reward_dir)
    reward_tokenizer = transformers.AutoTokenizer.from_pretrained(reward_dir)
    output_dir = settings.pop("output_dir")
    rounds = settings.pop("rounds")
    recipe = IterativeDPO(
        policy,
        tokenizer,
        prompts,
        reward_model,
        reward_tokenizer=reward_tokenizer,
        output_dir=output_dir,
        rounds=rounds,
        dpo_args=dpo_args,
        **settings,
    )
    print(recipe.plan().to_text())
    result = recipe.run()
    print(result.explanation)
    return 1 if result.stopped else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``loopguard`` command line; return the exit status (0 ok, 1 stopped by gates, 2 bad input)."""
    parser = _build_parser()
    args, strings = parser.parse_known_args(argv)  # iterative-dpo: the rest are trl.DPOConfig fields
    if strings and args.command != "iterative-dpo":
        parser.error(f"unrecognized arguments: {' '.join(strings)}")
    try:
        if args.command == "iterative-dpo":
            return _iterative_dpo(args, strings)
        if args.command == "report":
            return _report(args)
    except (LoopguardError, OSError) as error:
        print(f"loopguard: error: {error}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
