"""Every recipe in docs/recipes.md runs as the user would run it, and shows what the page says it shows.

Each script in examples/recipes/ runs as a real subprocess (``python examples/recipes/<name>.py``;
``multi_gpu.py`` under ``torch.distributed.run`` on 2 CPU processes with gloo). Importing TRL costs most of a
recipe's time, so the recipes the selected tests need are started together, two at a time, the first time a
test asks for one; each test then checks its own recipe's output.

The page itself is checked too: it links every recipe script and nothing else, and each ``py`` excerpt it
shows is a verbatim slice of the script it follows (so the page cannot drift from the tested code).
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import gloo_exit
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "recipes"
PAGE = ROOT / "docs" / "recipes.md"
SCRIPTS = sorted(path.name for path in RECIPES.glob("*.py") if not path.name.startswith("_"))
WORKERS = 2  # recipes at a time (multi_gpu.py is two processes itself)
TIMEOUT = 600


def _command(name: str, folder: pathlib.Path) -> list[str]:
    script = str(RECIPES / name)
    if name == "multi_gpu.py":
        return [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            script, "--output-dir", str(folder / "output"),
        ]  # fmt: skip
    return [sys.executable, script]


class Runs:
    """Runs the recipes the session's selected tests need, concurrently, once; hands out each one's result."""

    def __init__(self, names: list[str], folder: pathlib.Path) -> None:
        self.folder = folder
        # the environment is read here, in pytest's thread: pytest sets and deletes PYTEST_CURRENT_TEST in
        # os.environ as tests start and end, and copying os.environ in a worker thread meanwhile can find a
        # key listed and then gone (a KeyError that failed a CI run)
        self._environ = dict(os.environ)
        order = sorted(names, key=lambda name: name != "multi_gpu.py")  # the longest first
        self._pool = ThreadPoolExecutor(max_workers=WORKERS)
        self._futures = {name: self._pool.submit(self._run, name) for name in order}

    def _run(self, name: str) -> subprocess.CompletedProcess[str]:
        folder = self.folder / name.removesuffix(".py")
        folder.mkdir()
        env = dict(self._environ)
        paths = [str(ROOT), env.get("PYTHONPATH")]
        if name == "multi_gpu.py":  # each process says which gloo threads it leaves running at exit
            paths.insert(0, gloo_exit.install(folder))
        env.update(
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            OMP_NUM_THREADS="1",
            TQDM_DISABLE="1",
            TMPDIR=str(folder),  # the recipes' temp output folders land here, not in /tmp
            PYTHONPATH=os.pathsep.join(filter(None, paths)),
        )
        return subprocess.run(
            _command(name, folder), cwd=folder, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )

    def output(self, name: str) -> str:
        done = self._futures[name].result()
        assert done.returncode == 0, f"{name} failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
        return f"{done.stdout}\n{done.stderr}"  # stderr: loopguard's status lines

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    wanted = set()
    for item in request.session.items:  # the recipes of the selected tests (all of them, or one with -k)
        callspec = getattr(item, "callspec", None)
        if getattr(item, "module", None) is sys.modules[__name__] and callspec and "name" in callspec.params:
            wanted.add(callspec.params["name"])
    started = Runs(sorted(wanted), tmp_path_factory.mktemp("recipes"))
    yield started
    started.close()


def _line(output: str, prefix: str) -> str:
    found = [line for line in output.splitlines() if line.startswith(prefix)]
    assert found, f"no line starting with {prefix!r} in:\n{output}"
    return found[-1]


def _summary(output: str, prefix: str) -> tuple[int, int, list[str]]:
    """(decisions, HACK verdicts, actions) from a recipe's summary line."""
    line = _line(output, prefix)
    match = re.search(r"(\d+) decisions.*?, (\d+) HACK; actions (\[.*?\])", line)
    assert match, line
    actions = [action.split(":")[1] for action in ast.literal_eval(match.group(3))]
    return int(match.group(1)), int(match.group(2)), actions


def _number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return float(match.group(1))


def check_grpo_one_liner(output: str) -> None:
    decisions, hacks, actions = _summary(output, "one-liner:")
    assert decisions == 30  # one decision per step
    assert hacks >= 1  # the flawed reward was caught
    assert "raise_beta" in actions
    logged = _line(output, "logged at step 30:")
    assert {"loopguard/beta", "loopguard/verdict"} <= set(
        re.findall(r"loopguard/\w+", logged)
    )  # trainer's logs
    assert "Raised beta 0.04 ->" in _line(output, "first action: step")  # explained, with numbers
    # printed through the trainer's logging while it ran (stderr): a status line at the first WARN / HACK,
    # the start of the raises, and the end-of-run summary
    alarm = _line(output, "loopguard: step ")
    assert re.search(r"^loopguard: step \d+: OK -> (WARN|HACK) \(vote ", output, re.MULTILINE), output
    assert re.search(r"^loopguard: step \d+: .*; raised beta 0\.04 -> ", output, re.MULTILINE), alarm
    assert re.search(r"^loopguard summary:\nMitigation log \(run [\w-]+\): 30 steps observed", output, re.M)


def check_grpo_full_protection(output: str) -> None:
    decisions, hacks, actions = _summary(output, "full protection:")
    assert decisions == 40
    assert hacks >= 1
    assert {"raise_beta", "rollback", "stop"} & set(actions)
    signals = _line(output, "signals:")
    assert "rm_ensemble, takeover, gold" in signals  # the configured signals all ran
    assert (
        "['checkpoint-20', 'checkpoint-40']" in signals
    )  # loopguard's state went into each trainer checkpoint
    assert "good rollback checkpoints ()" not in signals  # the named store holds confirmed checkpoints


def check_rloo(output: str) -> None:
    decisions, hacks, actions = _summary(output, "RLOO:")
    assert (decisions, hacks >= 1, "raise_beta" in actions) == (30, True, True)
    assert _number(r"max beta ([\d.]+)", output) > 0.05  # written into RLOO's trainer.beta


def check_online_dpo_judge(output: str) -> None:
    decisions, hacks, actions = _summary(output, "online DPO:")
    assert (decisions, hacks >= 1, "raise_beta" in actions) == (30, True, True)  # a signal voted, via the tap
    assert "read from ['tap']" in output
    summary = _line(output, "online DPO:")
    assert _number(r"beta up to ([\d.]+)", summary) > 0.1  # raised, through trainer._beta
    assert _number(r"final beta ([\d.]+)", summary) >= 0.1  # never below the user's beta
    assert "the tap recorded 30 judge calls of 16 completions each" in output


def check_grpo_lora(output: str) -> None:
    decisions, hacks, actions = _summary(output, "LoRA: 30")
    assert (decisions, hacks >= 1, "raise_beta" in actions) == (30, True, True)
    model = _line(output, "LoRA: PeftModel")
    trained, total = (int(n) for n in re.search(r"(\d+) of (\d+) parameters trained", model).groups())
    assert trained < total / 2  # only the adapter trains
    assert "in_memory=True" in model
    assert "checkpoints (0," in model  # the starting adapter is step 0


def check_resume(output: str) -> None:
    saved = _line(output, "saved at step 20:")
    resumed = _line(output, "resumed at step 20:")
    run = re.search(r"run (\S+),", saved).group(1)
    beta = _number(r"beta ([\d.]+),", saved)
    assert beta > 0.04  # the hack raised beta before the checkpoint
    assert f"run {run}," in resumed  # the same run
    assert f"beta at step 21 {beta:.4g} (args.beta" in resumed  # the saved beta, not args.beta
    assert "20 batches seen" in saved
    assert "30 batches seen after step 30" in resumed  # the Guard's counters went on
    assert resumed.endswith("good rollback checkpoints (0,)")  # the store kept what was saved before


def check_multi_gpu(output: str) -> None:
    ranks = sorted(line for line in output.splitlines() if re.match(r"rank \d of 2:", line))
    assert [line[:11] for line in ranks] == ["rank 0 of 2", "rank 1 of 2"], output
    assert ranks[0][11:] == ranks[1][11:]  # same run, beta, rollbacks, Guard state and weights on both ranks
    log = _line(output, "mitigation log (rank 0):")
    assert "20 decisions" in log
    assert "raise_beta" in log
    assert "in_memory=False" in log  # several processes: the store is on disk, where every rank reads it
    # No rank leaves gloo's threads to the interpreter's teardown, where they can abort a finished rank
    # (SIGABRT, pytorch/pytorch#179291; it failed this test once in many runs under load). Ending the process
    # group was not enough while the trainer still kept it alive: its threads kept running.
    assert gloo_exit.reports(output) == [("0", "[]"), ("1", "[]"), ("none", "[]")], output[-3000:]


def check_raw_loop(output: str) -> None:
    summary = _line(output, "raw loop:")
    assert re.search(r"^step \d+: raise_beta, beta now", output, flags=re.MULTILINE), output
    assert _number(r"beta ([\d.]+),", summary) >= 0.04  # never below the starting beta
    assert "rollbacks [" in summary


CHECKS = {
    "grpo_one_liner.py": check_grpo_one_liner,
    "grpo_full_protection.py": check_grpo_full_protection,
    "rloo.py": check_rloo,
    "online_dpo_judge.py": check_online_dpo_judge,
    "grpo_lora.py": check_grpo_lora,
    "resume.py": check_resume,
    "multi_gpu.py": check_multi_gpu,
    "raw_loop.py": check_raw_loop,
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_recipe_runs_and_shows_what_the_page_says(name, runs):
    assert name in CHECKS, f"examples/recipes/{name} has no check in tests/test_recipes.py"
    CHECKS[name](runs.output(name))


def test_every_recipe_has_a_check():
    assert sorted(CHECKS) == SCRIPTS


LINK = re.compile(r"\]\(\.\./examples/recipes/([\w.]+)\)")
EXCERPT = re.compile(r"^```py\n(.*?)^```", re.DOTALL | re.MULTILINE)


def test_the_page_links_every_recipe_and_only_recipes():
    linked = set(LINK.findall(PAGE.read_text()))
    assert all((RECIPES / name).is_file() for name in linked), linked
    recipes = {name for name in linked if not name.startswith("_")}  # _tiny.py: the shared stand-ins
    assert recipes == set(SCRIPTS), (
        f"not linked: {set(SCRIPTS) - recipes}; not a recipe: {recipes - set(SCRIPTS)}"
    )


def test_every_excerpt_on_the_page_is_a_slice_of_its_recipe():
    text = PAGE.read_text()
    excerpts = list(EXCERPT.finditer(text))
    assert len(excerpts) >= len(SCRIPTS)
    for excerpt in excerpts:
        before = LINK.findall(text[: excerpt.start()])
        assert before, f"an excerpt before any recipe link:\n{excerpt.group(1)}"
        source = (RECIPES / before[-1]).read_text()
        assert excerpt.group(1) in source, f"not a verbatim slice of {before[-1]}:\n{excerpt.group(1)}"


def test_the_page_is_linked_from_the_index_and_the_readme():
    assert "(recipes.md)" in (ROOT / "docs" / "index.md").read_text()
    assert "(docs/recipes.md)" in (ROOT / "README.md").read_text()
