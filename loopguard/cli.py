"""The ``loopguard`` console script.

Subcommands:

* ``loopguard iterative-dpo --plan-only --output-dir DIR --rounds N [...]`` prints the plan of an iterative
  DPO run (per-round folders, policy and reference of each round, gates) and writes nothing.
* ``loopguard iterative-dpo --policy DIR --prompts FILE --reward-model DIR --output-dir DIR --rounds N [...]``
  runs it: the policy and the reward model (``num_labels=1``) are folders saved with ``save_pretrained``
  (tokenizers included); prompts are a ``.jsonl`` file with a ``"prompt"`` field, or a text file with one
  prompt per line. Rerunning resumes after the last finished round.
* ``loopguard report LOG [-o OUT.png|OUT.html] [--skip-corrupt] [--run ID]`` prints a plain-English summary
  of a mitigation log (what tripped and when, every action, the outcome), run by run when several runs
  appended to it; with ``-o`` it also draws one run (``--run``, default the newest) -- beta, the vote and
  each signal's score over steps -- to a PNG, or to an HTML page with the summary and the actions'
  explanations (needs the ``plot`` extra: matplotlib). Only ``LOG`` itself is read, not its rotated files.

``import loopguard.cli`` is light: torch, transformers and TRL are imported only by a command that trains, and
matplotlib only by ``report -o``.

Example:
    >>> from loopguard.cli import main
    >>> main(["iterative-dpo", "--plan-only", "--output-dir", "runs/x", "--rounds", "1", "--policy", "sft"])
    iterative DPO plan: 1 round(s) in runs/x
    ...
    0
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from loopguard.exceptions import ConfigError, LoopguardError

__all__ = ["main"]

_MAX_PROMPT_FILE_BYTES = 1 << 30


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


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loopguard", description="loopguard command-line tools.")
    parser.add_argument("--version", action=_VersionAction, help="print the version of loopguard and exit")
    commands = parser.add_subparsers(dest="command", required=True)
    idpo = commands.add_parser(
        "iterative-dpo",
        help="plan or run iterative DPO with safety gates between rounds",
        description="Iterative DPO: sample K completions per prompt, score, pair, train DPO against the "
        "previous round's policy, gate, promote. See docs/iterative_dpo.md.",
    )
    idpo.add_argument("--output-dir", required=True, help="folder of the run (round-NN/, manifest.json)")
    idpo.add_argument("--rounds", type=int, required=True, help="number of rounds, 1 to 100")
    idpo.add_argument("--plan-only", action="store_true", help="print the plan and exit; write nothing")
    idpo.add_argument("--policy", help="folder of the starting policy (save_pretrained format)")
    idpo.add_argument("--prompts", help="prompts: .jsonl with a 'prompt' field, or one prompt per line")
    idpo.add_argument(
        "--reward-model", help="folder of a sequence-classification reward model (num_labels=1)"
    )
    idpo.add_argument("--samples-per-prompt", type=int, default=4, help="K completions per prompt (>= 2)")
    idpo.add_argument("--pairs-per-round", type=int, default=None, help="cap on pairs per round")
    idpo.add_argument("--prompts-per-round", type=int, default=None, help="fresh prompts per round")
    idpo.add_argument("--pairing", default="max_min", help="max_min, max_random, max_max or length_penalized")
    idpo.add_argument("--beta", type=float, default=0.1, help="DPO beta (default 0.1)")
    idpo.add_argument("--max-new-tokens", type=int, default=64, help="longest sampled completion")
    idpo.add_argument("--max-failed-rounds", type=int, default=2, help="stop after this many blocked rounds")
    idpo.add_argument("--seed", type=int, default=0, help="base seed")
    idpo.add_argument(
        "--dpo-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a DPOConfig field, VALUE parsed as JSON when it can be (repeatable), e.g. learning_rate=1e-6",
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


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "output_dir": args.output_dir,
        "rounds": args.rounds,
        "samples_per_prompt": args.samples_per_prompt,
        "pairs_per_round": args.pairs_per_round,
        "prompts_per_round": args.prompts_per_round,
        "pairing": args.pairing,
        "beta": args.beta,
        "max_new_tokens": args.max_new_tokens,
        "max_failed_rounds": args.max_failed_rounds,
        "seed": args.seed,
    }


def _dpo_args(pairs: Sequence[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in pairs:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            msg = f"`--dpo-arg` must be KEY=VALUE, got {item!r}."
            raise ConfigError(msg)
        try:
            values[key] = json.loads(raw)
        except ValueError:
            values[key] = raw
    return values


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


def _iterative_dpo(args: argparse.Namespace) -> int:
    from loopguard.recipes.iterative_dpo import IterativeDPOConfig

    settings = _settings(args)
    if args.plan_only:
        config = IterativeDPOConfig(**settings)
        print(config.plan(initial_policy=args.policy).to_text())
        return 0
    missing = [flag for flag, value in (("--policy", args.policy), ("--prompts", args.prompts),
               ("--reward-model", args.reward_model)) if value is None]  # fmt: skip
    if missing:
        msg = f"`loopguard iterative-dpo` needs {', '.join(missing)} to run (or --plan-only), got none."
        raise ConfigError(msg)
    IterativeDPOConfig(**settings)  # fail on bad settings before loading any model
    dpo_args = _dpo_args(args.dpo_arg)
    prompts = _read_prompts(args.prompts)

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from loopguard.recipes.iterative_dpo import IterativeDPO

    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    reward_model = AutoModelForSequenceClassification.from_pretrained(args.reward_model)
    reward_tokenizer = AutoTokenizer.from_pretrained(args.reward_model)
    output_dir = settings.pop("output_dir")
    rounds = settings.pop("rounds")
    recipe = IterativeDPO(
        args.policy,
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
    args = parser.parse_args(argv)
    try:
        if args.command == "iterative-dpo":
            return _iterative_dpo(args)
        if args.command == "report":
            return _report(args)
    except (LoopguardError, OSError) as error:
        print(f"loopguard: error: {error}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse rejects it first
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
