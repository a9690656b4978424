"""Read a mitigation log the way a person would: a plain-English summary and a figure.

:func:`summarize` turns the records of a mitigation log (as returned by
:func:`~loopguard.log.read_mitigation_log`) into a few lines: what was observed, what tripped and when, every
action taken, and how the run ended. :func:`render_report` draws the run (beta, the vote, each signal's score,
over steps) to a PNG, or to a self-contained HTML page with the summary and the actions' explanations; it
needs the ``plot`` extra (matplotlib). The ``loopguard report LOG [-o OUT]`` command (:mod:`loopguard.cli`)
prints the one and writes the other.

The WARN and HACK levels of the vote are read from the log when its explanations carry them
(``"HACK (vote 0.71 >= 0.30)"``), otherwise the :class:`~loopguard.Guard` defaults (0.10 and 0.30) are used.

Example:
    >>> from loopguard.report import summarize
    >>> def record(step, verdict="OK", vote=0.02, action="none", before=0.04, after=0.04, why=""):
    ...     return {"step": step, "mode": "kl_control", "verdict": verdict, "vote": vote, "action": action,
    ...             "beta_before": before, "beta_after": after, "explanation": why or f"step {step}: OK.",
    ...             "signals": {"repetition": vote, "repetition.rate": 0.5}}
    >>> records = [record(s, vote=None, why=f"step {s}: warming up ({s}/3 steps); no action.")
    ...            for s in (1, 2, 3)]
    >>> records += [record(4), record(5, "HACK", 0.62, "raise_beta", 0.04, 0.06),
    ...             record(6, "HACK", 0.55, "raise_beta", 0.06, 0.09), record(7, "WARN", 0.2, before=0.09,
    ...             after=0.09), record(8, vote=0.0, action="lower_beta", before=0.09, after=0.06)]
    >>> print(summarize(records))
    Mitigation log: 8 steps observed (steps 1-8), mode kl_control, warm-up 3 steps; worst verdict HACK.
    Tripped: HACK first at step 5, WARN first at step 7; 2 HACK and 1 WARN step(s) in all.
    Highest signal scores at the first HACK (step 5, vote 0.62 >= 0.30): repetition 0.62.
    Actions:
      - raised beta 0.04 -> 0.09 over steps 5-6 (2 raises)
      - lowered beta 0.09 -> 0.06 at step 8
    Outcome: ended at step 8 with verdict OK (healthy); beta 0.06 at the end (0.04 at the start).
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from loopguard._types import HACK_LEVEL, VERDICTS, WARN_LEVEL
from loopguard._validation import check_path, describe, import_extra
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError
from loopguard.log import EVENTS, RunLog, split_runs

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["render_report", "summarize"]

_SUFFIXES = (".png", ".html")
_RANK = {verdict: rank for rank, verdict in enumerate(VERDICTS)}
_WARMUP = re.compile(r"warming up \((\d+)/(\d+) steps\)")
_LEVEL = {verdict: re.compile(rf"\b{verdict} \(vote [0-9.]+ >= ([0-9.]+)\)") for verdict in ("WARN", "HACK")}
_VERDICT_COLOURS = {"OK": "#2ca02c", "WARN": "#ff7f0e", "HACK": "#d62728"}
_ACTION_STYLE = {  # marker, colour, legend label
    "raise_beta": ("^", "#d62728", "raise beta"),
    "lower_beta": ("v", "#1f77b4", "lower beta"),
    "rollback": ("X", "#9467bd", "rollback"),
    "stop": ("s", "#000000", "stop"),
}
_FIRST_SENTENCE_CHARS = 240
_MAX_NOTES = 12  # notes listed in the summary; the rest are counted
# Characters that must not reach a terminal (or a figure, or a page) as they are: C0 controls, DEL, C1
# controls (ANSI escape sequences start with ESC or CSI), the Unicode line and paragraph separators, and the
# bidirectional controls that can make text read differently from what it holds.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape_control(match: re.Match[str]) -> str:
    return repr(match.group())[1:-1]  # every character _CONTROLS matches is one repr escapes


def _visible(text: str) -> str:
    r"""Write every control character of ``text`` as its Python escape (``\x1b``, ``\r``, ``\u202e``).

    Example:
        >>> print(_visible("kl\x1b[31m_control\r\u202e"))
        kl\x1b[31m_control\r\u202e
    """
    return _CONTROLS.sub(_escape_control, text)


def _fmt(value: float | None) -> str:
    return "unset" if value is None else f"{value:.4g}"


def _number(record: Mapping[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _adapter(record: Mapping[str, Any]) -> Mapping[str, Any]:
    extra = record.get("extra")
    adapter = extra.get("adapter") if isinstance(extra, Mapping) else None
    return adapter if isinstance(adapter, Mapping) else {}


def _check_records(records: object) -> list[Mapping[str, Any]]:
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Sequence):
        msg = f"`records` must be a list of mitigation records (mappings), got {describe(records)}."
        raise LoopguardTypeError(msg)
    if not records:
        msg = "`records` must hold at least one mitigation record, got an empty log."
        raise InputError(msg)
    checked: list[Mapping[str, Any]] = []
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            msg = f"`records[{index}]` must be a mapping (one log record), got {describe(record)}."
            raise LoopguardTypeError(msg)
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            msg = f"`records[{index}]['step']` must be an int, got {describe(step)}."
            raise InputError(msg)
        event = record.get("event", "decision")
        if event not in EVENTS:
            msg = f"`records[{index}]['event']` must be one of {', '.join(EVENTS)}, got {describe(event)}."
            raise InputError(msg)
        if event == "decision" and record.get("verdict") not in _RANK:
            verdict = describe(record.get("verdict"))
            msg = f"`records[{index}]['verdict']` must be one of OK, WARN, HACK, got {verdict}."
            raise InputError(msg)
        checked.append(record)
    return checked


def _scores(record: Mapping[str, Any]) -> dict[str, float]:
    """Each detector's score: the ``signals`` keys without a dot (the dotted ones are raw statistics)."""
    signals = record.get("signals")
    if not isinstance(signals, Mapping):
        return {}
    scores: dict[str, float] = {}
    for name, value in signals.items():
        if "." in str(name) or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            scores[str(name)] = float(value)
    return scores


def _levels(records: Sequence[Mapping[str, Any]]) -> tuple[float, float, bool]:
    """The vote's WARN and HACK levels, and whether both were read from the log (else Guard defaults)."""
    found: dict[str, float] = {}
    for record in records:
        extra = record.get("extra")
        for verdict, key in (("WARN", "warn_level"), ("HACK", "hack_level")):
            value = extra.get(key) if isinstance(extra, Mapping) else None
            if verdict not in found and isinstance(value, (int, float)) and not isinstance(value, bool):
                found[verdict] = float(value)
        explanation = record.get("explanation")
        if isinstance(explanation, str):
            for verdict, pattern in _LEVEL.items():
                match = pattern.search(explanation) if verdict not in found else None
                if match is not None:
                    found[verdict] = float(match.group(1))
        if len(found) == 2:
            break
    warn = found.get("WARN", WARN_LEVEL)
    hack = found.get("HACK", HACK_LEVEL)
    return warn, hack, len(found) == 2


def _warmup(records: Sequence[Mapping[str, Any]]) -> tuple[int | None, list[int]]:
    """The warm-up length named in the log (None when no record is a warm-up step) and the warm-up steps."""
    length: int | None = None
    steps: list[int] = []
    for record in records:
        extra = record.get("extra")
        declared = extra.get("warmup_steps") if isinstance(extra, Mapping) else None
        if length is None and isinstance(declared, int) and not isinstance(declared, bool):
            length = declared
        explanation = record.get("explanation")
        match = _WARMUP.search(explanation) if isinstance(explanation, str) else None
        if match is not None:
            length = length if length is not None else int(match.group(2))
            steps.append(int(record["step"]))
    return length, steps


def _span(first: int, last: int) -> str:
    return f"at step {first}" if first == last else f"over steps {first}-{last}"


def _beta_change(record: Mapping[str, Any]) -> str:
    before, after = _number(record, "beta_before"), _number(record, "beta_after")
    if before is None or after is None or before == after:
        return ""
    return f"beta {_fmt(before)} -> {_fmt(after)}"


def _actions(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every action, in order: runs of raises (or lowers) grouped until another action, one line per event."""
    lines: list[str] = []
    run: list[Mapping[str, Any]] = []

    def close_run() -> None:
        if not run:
            return
        first, last = run[0], run[-1]
        verb, noun = ("raised", "raise") if first["action"] == "raise_beta" else ("lowered", "lower")
        count = f" ({len(run)} {noun}s)" if len(run) > 1 else ""
        betas = f"{_fmt(_number(first, 'beta_before'))} -> {_fmt(_number(last, 'beta_after'))}"
        lines.append(f"{verb} beta {betas} {_span(int(first['step']), int(last['step']))}{count}")
        run.clear()

    previous = "none"
    for record in records:
        action = record.get("action", "none")
        if action in ("raise_beta", "lower_beta"):
            if run and run[0]["action"] != action:
                close_run()
            run.append(record)
        elif action == "rollback":
            close_run()
            adapter = _adapter(record)
            target = adapter.get("rolled_back_to")
            details = [_beta_change(record)]
            if isinstance(target, int) and not isinstance(target, bool):
                text = f"rolled back at step {record['step']} to step {target}"
            elif "rollback_error" in adapter:
                text = f"asked to roll back at step {record['step']}"
                details.append(f"it failed: {adapter['rollback_error']}")
            else:
                text = f"rolled back at step {record['step']}"
            details = [item for item in details if item]
            lines.append(text + (f" ({'; '.join(details)})" if details else ""))
        elif action == "stop" and previous != "stop":  # the Guard repeats "stop" on every later step
            close_run()
            adapter = _adapter(record)
            details = [_beta_change(record)]
            restored = adapter.get("restored_at_stop", "absent")
            if isinstance(restored, int) and not isinstance(restored, bool):
                details.append(f"restored step {restored}'s weights")
            elif restored is None:
                details.append("no good checkpoint to restore")
            if "restore_error" in adapter:
                details.append(f"restoring failed: {adapter['restore_error']}")
            details = [item for item in details if item]
            text = f"stopped at step {record['step']}"
            lines.append(text + (f" ({'; '.join(details)})" if details else ""))
        previous = action
    close_run()
    return lines


def _first_sentence(text: str) -> str:
    head = text.split(". ")[0].rstrip(".")
    if len(head) > _FIRST_SENTENCE_CHARS:
        head = head[: _FIRST_SENTENCE_CHARS - 3] + "..."
    return head


def summarize(records: Sequence[Mapping[str, Any]], *, run: str | None = None) -> str:
    r"""Say in a few plain-English lines what a mitigation log records.

    The lines are: what was observed (records, first and last step, mode, warm-up, the worst verdict); what
    tripped (the first WARN and first HACK steps, and the signals that scored highest at the first HACK);
    every action, grouped (runs of raises or lowers, rollbacks with the step restored, the stop with the
    weights restored); the Guard's one-time notes with their steps (a signal skipped for a missing input,
    the judges ``judge_gap`` counts; at most 12, the rest counted); and the outcome (final verdict, stopped
    or not, final beta against the starting one).
    A healthy log says that nothing tripped and nothing was changed. The text depends only on the records.

    Runs are kept apart (:func:`~loopguard.log.split_runs`): a log that several runs appended to (a reused
    ``output_dir``) is summarised run by run, in the order the runs first appear, each under its identity.
    Within a run, the records of a timeline abandoned by ``resume_from_checkpoint`` are left out (a line says
    how many and which steps), and loopguard's own failures while training ran are counted with their steps.
    It is safe to print to a terminal: control characters in names and explanations from the log (ANSI
    escape sequences, carriage returns, line breaks, other C0 and C1 controls, bidirectional overrides) are
    written as their Python escapes (``\x1b``, ``\r``, ``\u202e``), so no name adds a line or moves the
    cursor.

    Args:
        records: The log's records in file order, as returned by :func:`~loopguard.log.read_mitigation_log`
            (mappings with at least ``step``, and ``verdict`` for a decision; other keys may be missing or
            null).
        run: Summarise only this run (an identity the log holds); default: every run.

    Returns:
        The summary: lines joined by newlines, no trailing newline. The first line stands alone as a title.

    Raises:
        LoopguardTypeError: ``records`` is not a sequence of mappings.
        InputError: ``records`` is empty, a record has no int ``step``, a decision no valid ``verdict``, or
            ``run`` names no run of the log.

    Example:
        >>> from loopguard.report import summarize
        >>> healthy = [{"step": s, "mode": "log_only", "verdict": "OK", "vote": 0.01} for s in range(10, 15)]
        >>> print(summarize(healthy))
        Mitigation log: 5 steps observed (steps 10-14), mode log_only, no warm-up in this log;
        worst verdict OK.
        Nothing tripped: every verdict was OK, and nothing was changed.
        Outcome: ended at step 14 with verdict OK (healthy); no beta recorded (log_only).
    """
    runs = _chosen_runs(_check_records(records), run)
    if len(runs) == 1:
        lines = _summary_lines(runs[0])
        if runs[0].run is not None:
            lines[0] = lines[0].replace("Mitigation log:", f"Mitigation log (run {runs[0].run}):", 1)
    else:
        lines = [f"This log holds {len(runs)} runs; each is summarised on its own, in the order they began."]
        for one in runs:
            lines.extend(["", f"Run {one.run or '(no run identity)'}:"])
            lines.extend(f"  {line}" for line in _summary_lines(one))
    return "\n".join(_visible(line) for line in lines)  # names and explanations come from the log


def _chosen_runs(records: list[Mapping[str, Any]], run: str | None) -> list[RunLog]:
    runs = split_runs([dict(record) for record in records])
    if run is None:
        return runs
    chosen = [one for one in runs if one.run == run]
    if not chosen:
        known = ", ".join(repr(one.run) for one in runs)
        msg = f"`run` must name a run of this log ({known}), got {describe(run)}."
        raise InputError(msg)
    return chosen


def _summary_lines(run: RunLog) -> list[str]:
    """The summary of one run's live timeline, then its resumes and failures."""
    checked: list[Mapping[str, Any]] = list(run.records)
    lines = (
        _decision_lines(checked)
        if checked
        else [
            "Mitigation log: no decision recorded for this run (it stopped before its first observed step)."
        ]
    )
    resumes = [int(event["step"]) for event in run.events if event.get("event") == "resume"]
    if resumes:
        text = f"Resumed {len(resumes)} time(s), at step(s) {', '.join(map(str, resumes))}"
        if run.abandoned:
            steps = sorted({int(record["step"]) for record in run.abandoned})
            span = _span(steps[0], steps[-1])
            text += f"; {len(run.abandoned)} record(s) of abandoned timelines ({span}) are not counted"
        lines.append(text + ".")
    errors = [event for event in run.events if event.get("event") == "error"]
    if errors:
        where = ", ".join(str(event["step"]) for event in errors[:10]) + (", ..." if len(errors) > 10 else "")
        first = _first_sentence(str(errors[0].get("explanation", "")).strip())
        lines.append(f"loopguard failed {len(errors)} time(s) while training ran (steps {where}): {first}.")
    return lines


def _decision_lines(checked: list[Mapping[str, Any]]) -> list[str]:
    steps = [int(record["step"]) for record in checked]
    modes = list(dict.fromkeys(str(record.get("mode", "unknown")) for record in checked))
    mode_text = f"mode {modes[0]}" if len(modes) == 1 else f"modes {', '.join(modes)}"
    warmup, warm_steps = _warmup(checked)
    if warmup is None:
        warm_text = "no warm-up in this log"
    elif len(warm_steps) == len(checked):
        warm_text = f"warm-up {warmup} steps (still warming up at the end)"
    else:
        warm_text = f"warm-up {warmup} steps"
    worst = max((str(record["verdict"]) for record in checked), key=_RANK.__getitem__)
    first, last = min(steps), max(steps)
    span = f"step {first}" if first == last else f"steps {first}-{last}"
    observed = f"{len(checked)} step{'s' if len(checked) != 1 else ''} observed ({span})"
    lines = [f"Mitigation log: {observed}, {mode_text}, {warm_text}; worst verdict {worst}."]
    _, hack_level, _ = _levels(checked)
    actions = _actions(checked)
    if worst == "OK" and not actions:
        lines.append("Nothing tripped: every verdict was OK, and nothing was changed.")
    else:
        lines.extend(_tripped(checked, hack_level))
        if actions:
            lines.append("Actions:")
            lines.extend(f"  - {line}" for line in actions)
        else:
            why = " (log_only mode only records)" if modes == ["log_only"] else ""
            lines.append(f"Actions: none; nothing was changed{why}.")
    lines.extend(_notes(checked))
    lines.append(_outcome(checked))
    return lines


def _notes(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The Guard's one-time notes (a signal skipped, the judges judge_gap counts), each with its step."""
    found: list[str] = []
    for record in records:
        extra = record.get("extra")
        notes = extra.get("notes") if isinstance(extra, Mapping) else None
        if isinstance(notes, list):
            texts = (str(note).strip() for note in notes)
            found.extend(f"step {record['step']}: {text}" for text in texts if text)
    if not found:
        return []
    shown = [f"  - {note}" for note in found[:_MAX_NOTES]]
    if len(found) > _MAX_NOTES:
        shown.append(f"  - ... and {len(found) - _MAX_NOTES} more in the log (extra.notes)")
    return ["Notes:", *shown]


def _tripped(records: Sequence[Mapping[str, Any]], hack_level: float) -> list[str]:
    firsts: list[tuple[int, str]] = []
    counts: list[str] = []
    for verdict in ("HACK", "WARN"):
        matching = [record for record in records if record["verdict"] == verdict]
        if matching:
            firsts.append((int(matching[0]["step"]), verdict))
            counts.append(f"{len(matching)} {verdict}")
    order = sorted(firsts)  # the earlier alarm first
    head = ", ".join(f"{verdict} first at step {step}" for step, verdict in order)
    lines = [f"Tripped: {head}; {' and '.join(counts)} step(s) in all."]
    first_hack = next((record for record in records if record["verdict"] == "HACK"), None)
    if first_hack is not None:
        vote = _number(first_hack, "vote")
        vote_text = f", vote {vote:.2f} >= {hack_level:.2f}" if vote is not None else ""
        where = f"at the first HACK (step {first_hack['step']}{vote_text})"
        scores = sorted(_scores(first_hack).items(), key=lambda item: (-item[1], item[0]))[:3]
        explanation = first_hack.get("explanation")
        if scores:
            listed = ", ".join(f"{name} {score:.2f}" for name, score in scores)
            lines.append(f"Highest signal scores {where}: {listed}.")
        elif isinstance(explanation, str) and explanation.strip():
            lines.append(f"At the first HACK: {_first_sentence(explanation.strip())}.")
    return lines


def _outcome(records: Sequence[Mapping[str, Any]]) -> str:
    last = records[-1]
    stop = next((record for record in records if record.get("action") == "stop"), None)
    verdict = str(last["verdict"])
    if stop is not None:
        text = f"Outcome: stopped at step {stop['step']} with verdict {stop['verdict']}"
        if last is not stop and last.get("action") != "stop":
            text += f" (the log goes on to step {last['step']})"
    elif verdict == "OK":
        text = f"Outcome: ended at step {last['step']} with verdict OK (healthy)"
    else:
        text = f"Outcome: ended at step {last['step']} still {verdict}, not stopped"
    start = next((b for b in (_number(r, "beta_before") for r in records) if b is not None), None)
    end = next((b for b in (_number(r, "beta_after") for r in reversed(records)) if b is not None), None)
    if start is None and end is None:
        modes = {str(record.get("mode")) for record in records}
        beta = "no beta recorded" + (" (log_only)" if modes == {"log_only"} else "")
    elif start == end:
        beta = f"beta {_fmt(end)}, as it started"
    else:
        beta = f"beta {_fmt(end)} at the end ({_fmt(start)} at the start)"
    return f"{text}; {beta}."


# -------------------------------------------------------------------------------------------------- figure


def _output_kind(path: object) -> tuple[str, str]:
    text = check_path("output", path)
    suffix = os.path.splitext(text)[1].lower()
    if suffix not in _SUFFIXES:
        msg = f"`output` (-o) must end with .png or .html, got {text!r}."
        raise ConfigError(msg)
    return text, suffix


def _import_matplotlib() -> tuple[Any, Any]:
    hint = "render_report needs the `plot` extra: pip install 'loopguard[plot]' ({error})."
    # the parent package first, so a missing one is reported as such
    _, agg, figure = import_extra(hint, "matplotlib", "matplotlib.backends.backend_agg", "matplotlib.figure")
    return figure.Figure, agg.FigureCanvasAgg


def _values(records: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [math.nan if (value := _number(r, key)) is None else value for r in records]


def _runs(steps: Sequence[int], labels: Sequence[str]) -> list[tuple[float, float, str]]:
    """Contiguous runs of one label as (start, width, label), each step drawn as the unit around it."""
    runs: list[tuple[float, float, str]] = []
    start = 0
    for index in range(1, len(labels) + 1):
        if index == len(labels) or labels[index] != labels[start]:
            left, right = steps[start] - 0.5, steps[index - 1] + 0.5
            runs.append((left, right - left, labels[start]))
            start = index
    return runs


def _bands(ax: Axes, warn: float, hack: float, source: str, *, label: bool) -> None:
    ax.axhspan(warn, hack, color=_VERDICT_COLOURS["WARN"], alpha=0.10, linewidth=0)
    ax.axhspan(hack, 1.0, color=_VERDICT_COLOURS["HACK"], alpha=0.10, linewidth=0)
    for verdict, level in (("WARN", warn), ("HACK", hack)):
        ax.axhline(
            level,
            color=_VERDICT_COLOURS[verdict],
            linestyle=":",
            linewidth=1.0,
            label=f"{verdict} level {level:.2f} ({source})" if label else None,
        )


def _literal(texts: Any) -> None:
    """Draw matplotlib ``Text`` objects as written: no mathtext (``$...$``), no LaTeX."""
    for text in texts:
        text.set_parse_math(False)
        text.set_usetex(False)


def _legend(ax: Axes, *args: Any, **kwargs: Any) -> None:
    """``ax.legend(...)`` with every label drawn literally (a name from the log may hold ``$``)."""
    _literal(ax.legend(*args, **kwargs).get_texts())


def _note(ax: Axes, text: str) -> None:
    """Write ``text`` in the middle of an empty panel."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#555555")


def _draw_beta(
    beta_axis: Axes, axes: Sequence[Axes], steps: list[int], records: Sequence[Mapping[str, Any]]
) -> None:
    """Panel (a): beta over the steps, a marker per action, a dashed line on ``axes`` per rollback/stop."""
    betas = _values(records, "beta_after")
    known = [beta for beta in betas if not math.isnan(beta)]
    if known:
        beta_axis.step(steps, betas, where="post", color="#333333", linewidth=1.2, label="beta")
        positive = [beta for beta in known if beta > 0]
        if positive and max(positive) > 10 * min(positive) and len(positive) == len(known):
            beta_axis.set_yscale("log")
    else:
        _note(beta_axis, "no beta in this log (log_only)")
    beta_axis.set_ylabel("beta")
    for action, (marker, colour, label) in _ACTION_STYLE.items():
        hits = [(s, b) for s, b, r in zip(steps, betas, records, strict=True) if r.get("action") == action]
        if not hits:
            continue
        if action in ("rollback", "stop"):
            for step, _ in hits:
                for ax in axes:
                    ax.axvline(step, color=colour, linestyle="--", linewidth=1.0, alpha=0.7)
        marked = [(s, b) for s, b in hits if not math.isnan(b)]
        if marked:
            beta_axis.scatter(
                [s for s, _ in marked],
                [b for _, b in marked],
                marker=marker,
                color=colour,
                s=36,
                zorder=3,
                label=f"{label} ({len(hits)})",
            )
        else:
            beta_axis.plot([], [], linestyle="--", color=colour, label=f"{label} ({len(hits)})")
    if beta_axis.get_legend_handles_labels()[0]:
        _legend(beta_axis, loc="upper left", fontsize=8, ncol=3)


def _draw_vote(vote_axis: Axes, steps: list[int], records: Sequence[Mapping[str, Any]], warmed: bool) -> None:
    """Panel (b): the vote over the (already drawn) bands, and the verdicts as a strip under the curve."""
    from matplotlib.patches import Patch

    vote_axis.plot(steps, _values(records, "vote"), color="#333333", linewidth=1.2, label="vote")
    for left, width, verdict in _runs(steps, [str(record["verdict"]) for record in records]):
        vote_axis.broken_barh([(left, width)], (-0.12, 0.07), color=_VERDICT_COLOURS[verdict], linewidth=0)
    vote_axis.set_ylim(-0.14, 1.05)
    vote_axis.set_ylabel("vote")
    handles, labels = vote_axis.get_legend_handles_labels()
    for verdict, colour in _VERDICT_COLOURS.items():
        handles.append(Patch(color=colour, label=f"verdict {verdict}"))
        labels.append(f"verdict {verdict}")
    if warmed:
        handles.append(Patch(color="#7f7f7f", alpha=0.12))
        labels.append("warm-up")
    _legend(vote_axis, handles, labels, loc="upper left", fontsize=8, ncol=4)


def _draw_signals(signal_axis: Axes, steps: list[int], records: Sequence[Mapping[str, Any]]) -> None:
    """Panel (c): each detector's score over the (already drawn) bands."""
    names = sorted({name for record in records for name in _scores(record)})
    lines = []
    for name in names:
        values = [_scores(record).get(name, math.nan) for record in records]
        lines.extend(signal_axis.plot(steps, values, linewidth=1.2))
    if names:
        # labels passed explicitly: matplotlib would leave out a name starting with "_"
        labels = [_visible(name) for name in names]
        _legend(signal_axis, lines, labels, loc="upper left", fontsize=8, ncol=min(len(names), 5))
    else:
        _note(signal_axis, "no signal scores in this log")
    signal_axis.set_ylim(-0.02, 1.05)
    signal_axis.set_ylabel("signal score")
    signal_axis.set_xlabel("training step")


def _draw(figure: Any, records: Sequence[Mapping[str, Any]], title: str) -> None:
    steps = [int(record["step"]) for record in records]
    warn, hack, from_log = _levels(records)
    source = "from the log" if from_log else "Guard default"
    _, warm_steps = _warmup(records)
    beta_axis, vote_axis, signal_axis = figure.subplots(
        3, 1, sharex=True, gridspec_kw={"height_ratios": [1.0, 1.0, 1.3]}
    )
    axes = (beta_axis, vote_axis, signal_axis)
    if warm_steps:
        for ax in axes:
            ax.axvspan(min(warm_steps) - 0.5, max(warm_steps) + 0.5, color="#7f7f7f", alpha=0.12, linewidth=0)
    _draw_beta(beta_axis, axes, steps, records)
    _bands(vote_axis, warn, hack, source, label=True)
    _draw_vote(vote_axis, steps, records, bool(warm_steps))
    _bands(signal_axis, warn, hack, source, label=False)
    _draw_signals(signal_axis, steps, records)
    for ax in axes:
        ax.grid(True, alpha=0.25)
    figure.suptitle(_visible(title), fontsize=10, parse_math=False, usetex=False)


def _html_text(text: str) -> str:
    """``text`` for an HTML element or attribute: controls escaped visibly, then ``&<>"'`` as entities."""
    return html.escape(_visible(text), quote=True)


def _html(summary: str, png: bytes, records: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    first_hack = next((record for record in records if record["verdict"] == "HACK"), None)
    for record in records:
        action = str(record.get("action", "none"))
        if action == "none" and record is not first_hack:
            continue
        before, after = _number(record, "beta_before"), _number(record, "beta_after")
        beta = "" if before is None and after is None else f"{_fmt(before)} -> {_fmt(after)}"
        what = action if action != "none" else "none (first HACK)"
        cells = [str(record["step"]), str(record["verdict"]), what, beta, str(record.get("explanation", ""))]
        rows.append("<tr>" + "".join(f"<td>{_html_text(cell)}</td>" for cell in cells) + "</tr>")
    title = _html_text(summary.split("\n", 1)[0])
    table = (
        "<table>\n<tr><th>step</th><th>verdict</th><th>action</th><th>beta</th><th>explanation</th></tr>\n"
        + "\n".join(rows)
        + "\n</table>"
        if rows
        else "<p>No actions were taken and no step was HACK.</p>"
    )
    image = base64.b64encode(png).decode("ascii")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>loopguard report: {title}</title>\n"
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px}pre{background:#f6f6f6;padding:1em;"
        "white-space:pre-wrap}img{max-width:100%}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px 8px;vertical-align:top;text-align:left}</style>\n</head>\n<body>\n"
        "<h1>loopguard report</h1>\n"
        f"<pre>{_html_text(summary)}</pre>\n"
        f'<img alt="beta, vote and signal scores over training steps" src="data:image/png;base64,{image}">\n'
        f"<h2>Actions and the first HACK</h2>\n{table}\n</body>\n</html>\n"
    )


def render_report(
    records: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], *, run: str | None = None
) -> str:
    """Draw a mitigation log to a PNG, or to a self-contained HTML page; needs the ``plot`` extra.

    Three panels share the step axis: (a) beta over steps (log scale when it spans more than 10x), with a
    marker per action (raise ^, lower v, rollback X, stop square) and a dashed vertical line at each rollback
    and stop; (b) the vote, with the WARN and HACK bands and the verdict of each step as a coloured strip;
    (c) each detector's score (the ``signals`` keys without a dot; ``"<signal>.<statistic>"`` entries are raw
    statistics and are not drawn), with the same bands. Warm-up steps are shaded grey. The bands are at the
    levels the log's explanations name, else at the Guard defaults (0.10 and 0.30); the legend says which.
    The title is the first line of :func:`summarize`. One run is drawn (its live timeline): the log's only
    run, or the one ``run`` names; runs are never mixed in one figure.

    ``.html`` writes one page with the figure embedded as a base64 PNG, the summary, and a table of the
    actions (and the first HACK) with their explanations. Every string from the log is shown as written:
    drawn without mathtext or LaTeX (a ``$`` stays a ``$``; a signal name starting with ``_`` is still in
    the legend), with control characters written as escapes (as in :func:`summarize`), and HTML-escaped
    (``&<>"'``) everywhere on the page (title, summary, table). The drawing uses its own
    :class:`matplotlib.figure.Figure` and the Agg canvas: pyplot and the global backend are not touched.

    Args:
        records: The log's records, as returned by :func:`~loopguard.log.read_mitigation_log`.
        path: Where to write: a ``.png`` or ``.html`` file (missing parent folders are created).
        run: The run to draw; required when the log holds more than one.

    Returns:
        ``path`` as a string.

    Raises:
        ConfigError: ``path`` ends with anything but ``.png`` or ``.html``.
        LoopguardTypeError, InputError: see :func:`summarize` (an empty log is an ``InputError``); a log of
            several runs without ``run``, or a run that recorded no decision.
        MissingDependencyError: matplotlib is not installed.
        OSError: the file cannot be written.

    Example:
        >>> import os, tempfile
        >>> from loopguard.report import render_report
        >>> records = [{"step": s, "mode": "log_only", "verdict": "OK", "vote": 0.0} for s in range(3)]
        >>> render_report(records, os.path.join(tempfile.mkdtemp(), "run.pdf"))
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `output` (-o) must end with .png or .html, got '...run.pdf'.
    """
    target, suffix = _output_kind(path)
    runs = _chosen_runs(_check_records(records), run)
    if len(runs) > 1:
        known = ", ".join(repr(one.run) for one in runs)
        msg = f"`run` must say which run to draw: this log holds {len(runs)} runs ({known}); got None."
        raise InputError(msg)
    if not runs[0].records:
        msg = f"run {runs[0].run!r} recorded no decision: there is nothing to draw."
        raise InputError(msg)
    summary = summarize(records, run=runs[0].run)
    checked = list(runs[0].records)
    figure_class, canvas_class = _import_matplotlib()
    figure = figure_class(figsize=(11.0, 9.0), dpi=100, layout="constrained")
    canvas_class(figure)
    _draw(figure, checked, summary.split("\n", 1)[0])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    png = buffer.getvalue()
    folder = os.path.dirname(target)
    if folder:
        os.makedirs(folder, exist_ok=True)
    if suffix == ".png":
        with open(target, "wb") as handle:
            handle.write(png)
    else:
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(_html(summary, png, checked))
    return target
