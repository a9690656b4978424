"""loopguard.report (summarize, render_report) and the `loopguard report` command."""

import html
import itertools
import pathlib
import re
import subprocess
import sys
import warnings

import pytest

from loopguard.cli import main
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError, MissingDependencyError
from loopguard.log import MitigationLog, read_mitigation_log
from loopguard.report import render_report, summarize

ADAPTERS = pathlib.Path(__file__).resolve().parent / "adapters"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _record(step, verdict="OK", vote=0.02, action="none", before=0.04, after=0.04, why=None, **more):
    record = {
        "step": step,
        "mode": more.pop("mode", "kl_control"),
        "verdict": verdict,
        "vote": vote,
        "signals": more.pop("signals", {"repetition": vote, "repetition.rate": 0.9}),
        "beta_before": before,
        "beta_after": after,
        "action": action,
        "explanation": why if why is not None else f"step {step}: {verdict} (vote {vote or 0:.2f}).",
    }
    record.update(more)
    return record


def _warmup(steps, total, **more):
    return [
        _record(s, vote=None, why=f"step {s}: warming up ({s}/{total} steps); no action.", **more)
        for s in steps
    ]


def _write(path, records):
    log = MitigationLog(path)
    for record in records:
        assert log.append(record)
    return str(path)


# ------------------------------------------------------------------------------------ a real GRPO run


@pytest.fixture(scope="module")
def hacked_log(tmp_path_factory):
    """A real GRPO run on a tiny GPT-2 where the echo hack trips the Guard and beta is raised."""
    pytest.importorskip("trl", reason="trl is part of the `hf` extra")
    pytest.importorskip("matplotlib", reason="matplotlib is part of the `plot` extra")
    sys.path.insert(0, str(ADAPTERS))
    try:
        import torch
        from adapter_helpers import build_tokenizer, grpo_trainer, make_echo_reward, save_tiny_model
    finally:
        sys.path.remove(str(ADAPTERS))

    from loopguard import BangBang, Guard, RewardHackMitigator

    folder = tmp_path_factory.mktemp("report-run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokenizer = build_tokenizer()
        model_dir = save_tiny_model(folder / "model", tokenizer)
        mitigator = RewardHackMitigator(
            guard=Guard(mode="kl_control", controller=BangBang(gain=3.0), warmup_steps=4)
        )
        trainer = grpo_trainer(
            model_dir, tokenizer, folder / "run", [make_echo_reward(3)], [mitigator], max_steps=18, beta=0.05
        )
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return str(folder / "run" / "mitigation_log.jsonl")


def test_report_of_a_real_grpo_run_png_and_html(hacked_log, tmp_path, capsys):
    import matplotlib.image

    records = read_mitigation_log(hacked_log)
    first_hack = next(r for r in records if r["verdict"] == "HACK")
    raises = [r for r in records if r["action"] == "raise_beta"]
    assert raises, "the echo hack must make the Guard raise beta"
    # the mitigator records the Guard's bands and warm-up, so the report never has to guess them
    guard_keys = ("warn_level", "hack_level", "warmup_steps")
    decisions = [r for r in records if r["event"] == "decision"]
    assert {tuple(r["extra"][key] for key in guard_keys) for r in decisions} == {(0.1, 0.3, 4)}
    assert records[0]["event"] == "start"
    assert summarize(records).startswith(f"Mitigation log (run {records[0]['run']}): 18 steps observed")

    png = tmp_path / "out" / "report.png"
    assert main(["report", hacked_log, "-o", str(png)]) == 0
    out = capsys.readouterr().out
    summary = summarize(records)
    assert out == f"{summary}\nwrote {png}\n"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(str(png))
    height, width = image.shape[:2]
    assert width >= 800
    assert height >= 600
    assert image.std() > 0.05  # something was drawn

    lines = summary.splitlines()
    assert lines[0] == (
        f"Mitigation log (run {records[0]['run']}): {len(decisions)} steps observed "
        f"(steps {decisions[0]['step']}-{decisions[-1]['step']}), mode kl_control, warm-up 4 steps; worst "
        "verdict HACK."
    )
    assert f"HACK first at step {first_hack['step']}" in summary
    scores = {k: v for k, v in first_hack["signals"].items() if "." not in k and v is not None}
    top = sorted(scores, key=lambda name: (-scores[name], name))[0]
    assert (
        f"at the first HACK (step {first_hack['step']}, vote {first_hack['vote']:.2f} >= 0.30): {top}"
        in summary
    )
    first_run_end = raises[0]
    for record in records[records.index(raises[0]) + 1 :]:
        if record["action"] not in ("raise_beta", "none"):
            break
        if record["action"] == "raise_beta":
            first_run_end = record
    first, last = raises[0]["step"], first_run_end["step"]
    span = f"at step {first}" if first == last else f"over steps {first}-{last}"
    assert (
        f"raised beta {raises[0]['beta_before']:.4g} -> {first_run_end['beta_after']:.4g} {span}" in summary
    )
    assert lines[-1].startswith("Outcome: ")
    assert f"{records[-1]['beta_after']:.4g}" in lines[-1]

    page = tmp_path / "report.html"
    assert main(["report", hacked_log, "--output", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert "data:image/png;base64,iVBORw0KGgo" in text  # the base64 of the PNG signature
    assert re.search(r"<pre>.*Mitigation log \(run .*</pre>", text, re.DOTALL)
    for line in lines:
        assert html.escape(line) in text
    for record in raises:
        assert html.escape(record["explanation"]) in text


# ------------------------------------------------------------------------------------ summaries


def test_summary_of_a_healthy_log_says_nothing_tripped():
    records = _warmup(range(1, 6), 5) + [_record(s) for s in range(6, 31)]
    summary = summarize(records)
    assert summary.splitlines() == [
        "Mitigation log: 30 steps observed (steps 1-30), mode kl_control, warm-up 5 steps; worst verdict OK.",
        "Nothing tripped: every verdict was OK, and nothing was changed.",
        "Outcome: ended at step 30 with verdict OK (healthy); beta 0.04, as it started.",
    ]
    assert summarize(records) == summary  # deterministic


def test_summary_of_a_log_only_run_with_hacks_and_no_beta():
    records = _warmup(range(0, 3), 3, mode="log_only", before=None, after=None)
    records += [_record(s, mode="log_only", before=None, after=None) for s in range(3, 8)]
    records += [
        _record(8, "WARN", 0.2, mode="log_only", before=None, after=None, signals={"length": 0.2}),
        _record(
            9, "HACK", 0.45, mode="log_only", before=None, after=None, signals={"length": 0.45, "drift": 0.1}
        ),
        _record(10, "HACK", 0.5, mode="log_only", before=None, after=None, extra={"notes": ["x"]}),
    ]
    lines = summarize(records).splitlines()
    assert lines == [
        "Mitigation log: 11 steps observed (steps 0-10), mode log_only, warm-up 3 steps; worst verdict HACK.",
        "Tripped: WARN first at step 8, HACK first at step 9; 2 HACK and 1 WARN step(s) in all.",
        "Highest signal scores at the first HACK (step 9, vote 0.45 >= 0.30): length 0.45, drift 0.10.",
        "Actions: none; nothing was changed (log_only mode only records).",
        "Notes:",
        "  - step 10: x",
        "Outcome: ended at step 10 still HACK, not stopped; no beta recorded (log_only).",
    ]


def test_summary_lists_the_notes_with_their_steps_and_counts_the_rest():
    records = _warmup(range(0, 3), 3, extra={"notes": ["drift: skipped, no rewards", "  "]})
    records += [_record(s, extra={"notes": [f"note {s}"]}) for s in range(3, 20)]
    lines = summarize(records).splitlines()
    assert lines[:3] == [
        "Mitigation log: 20 steps observed (steps 0-19), mode kl_control, warm-up 3 steps; worst verdict OK.",
        "Nothing tripped: every verdict was OK, and nothing was changed.",
        "Notes:",
    ]
    # three warm-up records carry the same two notes each; the blank one is left out
    assert lines[3:6] == [f"  - step {s}: drift: skipped, no rewards" for s in range(3)]
    assert lines[6:15] == [f"  - step {s}: note {s}" for s in range(3, 12)]
    assert lines[15] == "  - ... and 8 more in the log (extra.notes)"
    assert lines[16].startswith("Outcome: ended at step 19 with verdict OK")
    assert len(lines) == 17


def test_summary_of_raises_a_rollback_lowers_and_a_stop():
    why_hack = "step {}: HACK (vote 0.80 >= 0.35): repetition 0.80 (rate 0.9 vs baseline 0.1)."
    records = _warmup(range(1, 4), 3, before=0.001, after=0.001)
    records += [
        _record(4, before=0.001, after=0.001),
        _record(5, "WARN", 0.2, before=0.001, after=0.001, why="step 5: WARN (vote 0.20 >= 0.15)."),
    ]
    betas = [0.001, 0.003, 0.009, 0.027]
    for step, (before, after) in enumerate(itertools.pairwise(betas), start=6):
        records.append(_record(step, "HACK", 0.8, "raise_beta", before, after, why=why_hack.format(step)))
    records.append(_record(9, "HACK", 0.8, "none", 0.027, 0.027, why=why_hack.format(9)))
    records.append(_record(10, "HACK", 0.8, "raise_beta", 0.027, 0.42, why=why_hack.format(10)))
    records.append(_record(11, "HACK", 0.9, "rollback", 0.42, 0.42, extra={"adapter": {"rolled_back_to": 4}}))
    records.append(_record(12, "OK", 0.0, "lower_beta", 0.42, 0.2))
    records.append(_record(13, "OK", 0.0, "lower_beta", 0.2, 0.1))
    records.append(
        _record(14, "HACK", 0.9, "stop", 0.1, 0.15, extra={"adapter": {"restored_at_stop": 12}, "notes": []})
    )
    records.append(_record(15, "HACK", 0.9, "stop", 0.15, 0.15))  # the Guard repeats "stop"
    lines = summarize(records).splitlines()
    assert lines[0] == (
        "Mitigation log: 15 steps observed (steps 1-15), mode kl_control, warm-up 3 steps; worst verdict HACK."
    )
    assert (
        lines[1] == "Tripped: WARN first at step 5, HACK first at step 6; 8 HACK and 1 WARN step(s) in all."
    )
    assert lines[2] == "Highest signal scores at the first HACK (step 6, vote 0.80 >= 0.35): repetition 0.80."
    assert lines[3:9] == [
        "Actions:",
        "  - raised beta 0.001 -> 0.42 over steps 6-10 (4 raises)",
        "  - rolled back at step 11 to step 4",
        "  - lowered beta 0.42 -> 0.1 over steps 12-13 (2 lowers)",
        "  - stopped at step 14 (beta 0.1 -> 0.15; restored step 12's weights)",
        "Outcome: stopped at step 14 with verdict HACK; beta 0.15 at the end (0.001 at the start).",
    ]
    assert len(lines) == 9


def test_summary_tolerates_missing_fields_and_failed_restores():
    records = [
        {"step": 7, "verdict": "HACK", "vote": None, "action": "rollback", "extra": {"adapter": {}}},
        {"step": 8, "verdict": "HACK", "action": "stop", "extra": {"adapter": {"restored_at_stop": None}}},
    ]
    summary = summarize(records)
    assert "mode unknown, no warm-up in this log" in summary
    assert "  - rolled back at step 7" in summary
    assert "  - stopped at step 8 (no good checkpoint to restore)" in summary
    assert "Outcome: stopped at step 8 with verdict HACK; no beta recorded." in summary


def test_first_hack_falls_back_to_the_explanation_without_scores():
    records = [
        _record(
            1, "HACK", 0.5, signals={"repetition.rate": 0.9}, why="step 1: HACK (vote 0.50 >= 0.30). More."
        )
    ]
    assert "At the first HACK: step 1: HACK (vote 0.50 >= 0.30)." in summarize(records)


@pytest.mark.parametrize(
    ("records", "error", "match"),
    [
        ([], InputError, "`records` must hold at least one mitigation record, got an empty log."),
        ({"step": 1}, LoopguardTypeError, "`records` must be a list of mitigation records"),
        ([1], LoopguardTypeError, r"`records\[0\]` must be a mapping"),
        ([{"step": "1", "verdict": "OK"}], InputError, r"`records\[0\]\['step'\]` must be an int"),
        (
            [{"step": 1, "verdict": "BAD"}],
            InputError,
            r"`records\[0\]\['verdict'\]` must be one of OK, WARN, HACK",
        ),
    ],
)
def test_summarize_rejects_bad_records(records, error, match):
    with pytest.raises(error, match=match):
        summarize(records)


# ------------------------------------------------------------------------------------ figures


def test_render_report_of_a_log_only_run_and_html_escaping(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is part of the `plot` extra")
    records = _warmup(range(0, 3), 3, mode="log_only", before=None, after=None)
    records.append(
        _record(3, "HACK", 0.5, mode="log_only", before=None, after=None, why="<script>x</script>")
    )
    page = render_report(records, tmp_path / "a.html")
    text = pathlib.Path(page).read_text(encoding="utf-8")
    assert "<script>" not in text
    assert "&lt;script&gt;x&lt;/script&gt;" in text
    png = tmp_path / "b.PNG"
    assert render_report(records, png) == str(png)
    assert png.read_bytes()[:8] == PNG_SIGNATURE


def test_render_report_needs_matplotlib(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'loopguard\[plot\]'"):
        render_report([_record(1)], tmp_path / "a.png")
    assert not (tmp_path / "a.png").exists()


def test_render_report_rejects_other_suffixes_before_drawing(tmp_path):
    with pytest.raises(ConfigError, match=r"`output` \(-o\) must end with .png or .html, got '.*a.svg'."):
        render_report([_record(1)], tmp_path / "a.svg")
    with pytest.raises(InputError, match="empty log"):
        render_report([], tmp_path / "a.png")


# ------------------------------------------------------------------------------------ the command


def test_cli_report_prints_the_summary_only(tmp_path, capsys):
    records = _warmup(range(1, 4), 3) + [_record(s) for s in range(4, 9)]
    path = _write(tmp_path / "log.jsonl", records)
    assert main(["report", path]) == 0
    captured = capsys.readouterr()
    assert captured.out == summarize(read_mitigation_log(path)) + "\n"
    assert "Nothing tripped" in captured.out
    assert captured.err == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


# `loopguard report LOG` prints text: it must start fast, so it may not import the scientific stack
# (numpy, scipy and scikit-learn cost ~0.5 s at start-up, torch seconds); benchmarks/import_time.py times it.
_REPORT_SLOW = ("numpy", "scipy", "sklearn", "torch", "transformers", "matplotlib")


def _modules_left_by_report(path, before=""):
    code = (
        "import sys\n"
        f"{before}\n"
        "from loopguard.cli import main\n"
        "status = main(['report', sys.argv[1]])\n"
        f"print(status, sorted(name for name in {_REPORT_SLOW!r} if name in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, text=True, check=True, timeout=120
    )
    assert "Mitigation log: 8 steps observed" in done.stdout  # the summary was printed
    return done.stdout.strip().splitlines()[-1]


def test_cli_report_starts_without_numpy_scipy_sklearn_or_torch(tmp_path):
    records = _warmup(range(1, 4), 3) + [_record(s) for s in range(4, 7)]
    records += [_record(7, "HACK", 0.6, "raise_beta", 0.04, 0.06), _record(8, before=0.06, after=0.06)]
    path = _write(tmp_path / "log.jsonl", records)
    assert _modules_left_by_report(path) == "0 []"


def test_the_report_import_check_can_fail(tmp_path):
    # the check above proves something only if it sees these modules when something does import them
    path = _write(tmp_path / "log.jsonl", [_record(s) for s in range(1, 9)])
    loaded = _modules_left_by_report(path, before="import scipy.stats, sklearn, torch")
    assert loaded == "0 ['numpy', 'scipy', 'sklearn', 'torch']"


def test_cli_report_bad_inputs(tmp_path, capsys):
    path = _write(tmp_path / "log.jsonl", [_record(1)])

    assert main(["report", path, "-o", str(tmp_path / "x.pdf")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        captured.err
        == f"loopguard: error: `output` (-o) must end with .png or .html, got '{tmp_path}/x.pdf'.\n"
    )

    missing = str(tmp_path / "missing.jsonl")
    assert main(["report", missing]) == 2
    assert capsys.readouterr().err == (
        f"loopguard: error: `LOG` must be an existing mitigation log file, got '{missing}' (no such file).\n"
    )

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["report", str(empty)]) == 2
    assert "`LOG` must hold at least one record, got an empty mitigation log" in capsys.readouterr().err

    (tmp_path / "empty.jsonl.1").write_text("")
    assert main(["report", str(empty)]) == 2
    assert "rotated files" in capsys.readouterr().err

    assert main(["report", str(tmp_path)]) == 2
    assert "`LOG` must be a mitigation log file, got the folder" in capsys.readouterr().err

    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"not": "a record"}\n' + pathlib.Path(path).read_text())
    assert main(["report", str(corrupt)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("loopguard: error: mitigation log")
    assert err.count("\n") == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["report", str(corrupt), "--skip-corrupt"]) == 0
    assert "Mitigation log: 1 step observed (step 1), mode kl_control" in capsys.readouterr().out


def test_cli_report_matplotlib_missing_is_an_error_with_the_install_hint(monkeypatch, tmp_path, capsys):
    path = _write(tmp_path / "log.jsonl", [_record(1)])
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["report", path, "-o", str(tmp_path / "a.png")]) == 2
    assert "pip install 'loopguard[plot]'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ hostile names

# Everything the record validation lets through can reach the report: names (mode, signals) and
# explanations may hold any character but the null byte, so markup, mathtext and terminal controls too.
CONTROLS = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
HOSTILE_MODE = '<script>alert("m&m\'s")</script>'
HOSTILE_SIGNALS = {
    "$x^$": 0.9,  # a mathtext parse error when drawn as math
    "a$b$c": 0.8,  # drawn as "a", math b, "c" when parsed
    "<b>\"q\"&'s'</b>": 0.7,
    "_hidden": 0.6,  # matplotlib leaves "_"-labels out of a legend
    "\x1b[31mred\x1b[0m\r\u202eevil\x9b": 0.5,
    "tab\there\nnewline": 0.4,
}
HOSTILE_WHY = "step 5: HACK <script>alert('x')</script> & \"quotes\" \x1b[2J\rgone\x07 $x^$ \u2028next"


def _hostile_records():
    quiet = dict.fromkeys(HOSTILE_SIGNALS, 0.01)
    records = [_record(s, mode=HOSTILE_MODE, signals=quiet) for s in range(1, 5)]
    hack = {"mode": HOSTILE_MODE, "signals": HOSTILE_SIGNALS}
    records.append(_record(5, "HACK", 0.9, "raise_beta", 0.04, 0.06, why=HOSTILE_WHY, **hack))
    failed = {"adapter": {"rollback_error": "OSError: \x1b]0;pwned\x07 <i>&</i>"}}
    records.append(_record(6, "HACK", 0.9, "rollback", 0.06, 0.06, mode=HOSTILE_MODE, extra=failed))
    return records


def test_summary_escapes_terminal_controls_visibly():
    records = _hostile_records()
    summary = summarize(records)
    assert not CONTROLS.search(summary)
    lines = summary.split("\n")
    assert len(lines) == 7  # no name or explanation adds a line
    assert "\t" not in summary
    assert lines[0].startswith(f"Mitigation log: 6 steps observed (steps 1-6), mode {HOSTILE_MODE}, ")
    assert "$x^$ 0.90, a$b$c 0.80, <b>\"q\"&'s'</b> 0.70." in lines[2]
    assert "  - asked to roll back at step 6 (it failed: OSError: \\x1b]0;pwned\\x07 <i>&</i>)" in lines
    # the first-HACK explanation, used when there are no scores, is escaped as well
    only_why = [_record(1, "HACK", 0.9, signals={}, why="a\x1b[31mb\r\nc\u202ed.")]
    assert "At the first HACK: a\\x1b[31mb\\r\\nc\\u202ed." in summarize(only_why)
    modes = summarize([_record(1, mode="tab\tline\nbreak\x85")])
    assert "mode tab\\tline\\nbreak\\x85," in modes
    assert not CONTROLS.search(modes)
    assert "\t" not in modes
    assert modes.count("\n") == 2


def test_cli_report_prints_no_raw_controls(tmp_path, capsys):
    path = _write(tmp_path / "log.jsonl", _hostile_records())
    assert main(["report", path]) == 0
    out = capsys.readouterr().out
    assert not CONTROLS.search(out)
    assert "(it failed: OSError: \\x1b]0;pwned\\x07 <i>&</i>)" in out


def test_render_report_draws_hostile_names_literally(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is part of the `plot` extra")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    from loopguard.report import _draw

    records = _hostile_records()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no mathtext error, no missing-glyph warning for a control
        png = tmp_path / "hostile.png"
        assert render_report(records, png) == str(png)
        assert png.read_bytes()[:8] == PNG_SIGNATURE

        figure = Figure()
        FigureCanvasAgg(figure)
        title = summarize(records).split("\n", 1)[0]
        _draw(figure, records, title)
        figure.canvas.draw()
    texts = [text for text in figure.findobj(Text) if text.get_text()]
    legend_labels = {
        text.get_text() for ax in figure.axes if ax.get_legend() for text in ax.get_legend().get_texts()
    }
    shown = {
        "$x^$",
        "a$b$c",
        "<b>\"q\"&'s'</b>",
        "_hidden",
        "\\x1b[31mred\\x1b[0m\\r\\u202eevil\\x9b",
        "tab\\there\\nnewline",
    }
    assert shown <= legend_labels  # every signal is in the legend, "_hidden" included, escaped as printed
    assert figure.get_suptitle() == title
    for text in texts:
        if "$" in text.get_text():
            assert not text.get_parse_math(), text.get_text()
            assert not text.get_usetex(), text.get_text()
        assert not CONTROLS.search(text.get_text())


def test_render_report_html_escapes_every_string_from_the_log(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is part of the `plot` extra")
    records = _hostile_records()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        page = pathlib.Path(render_report(records, tmp_path / "hostile.html"))
    text = page.read_text(encoding="utf-8")
    assert not CONTROLS.search(text)
    # only the page's own markup: every tag is one the report writes
    tags = set(re.findall(r"</?([A-Za-z!][A-Za-z0-9]*)", text))
    page_tags = "!DOCTYPE html head meta title style body h1 h2 pre img table tr th td p"
    assert tags <= set(page_tags.split())
    for markup in ("<script", "<b>", "<i>"):
        assert markup not in text
    escaped_mode = html.escape(HOSTILE_MODE)
    assert escaped_mode == "&lt;script&gt;alert(&quot;m&amp;m&#x27;s&quot;)&lt;/script&gt;"
    title = re.search(r"<title>(.*)</title>", text).group(1)
    assert escaped_mode in title
    assert f"mode {escaped_mode}," in re.search(r"<pre>(.*)</pre>", text, re.DOTALL).group(1)
    cells = re.findall(r"<td>(.*?)</td>", text, re.DOTALL)
    shown_why = "step 5: HACK <script>alert('x')</script> & \"quotes\" \\x1b[2J\\rgone\\x07 $x^$ \\u2028next"
    assert html.escape(shown_why) in cells
    assert html.escape("<b>\"q\"&'s'</b>") in text
    alt = re.search(r'<img alt="([^"]*)"', text).group(1)
    assert "<" not in alt
    assert "&" not in alt.replace("&amp;", "")
