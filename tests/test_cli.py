"""The `loopguard` console script's conventions: --version; each command imports only what it uses."""

import importlib.metadata
import subprocess
import sys

import pytest

import loopguard
from loopguard.cli import main


def test_version_prints_the_installed_version_and_exits_0():
    done = subprocess.run(
        [sys.executable, "-m", "loopguard.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"loopguard {importlib.metadata.version('loopguard')}\n"


def test_version_reads_loopguard_version(monkeypatch, capsys):
    # loopguard.__version__ is the installed metadata's version, or "0.0.0+unknown" from a source tree
    monkeypatch.setattr(loopguard, "__version__", "9.9.9", raising=False)
    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out == "loopguard 9.9.9\n"


def test_a_command_is_still_required(capsys):
    with pytest.raises(SystemExit) as stopped:
        main([])
    assert stopped.value.code == 2
    assert "the following arguments are required: command" in capsys.readouterr().err
