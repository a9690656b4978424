"""Which gloo threads each process of a launched script still runs when its interpreter starts to exit.

gloo's worker threads still running in the interpreter's teardown can abort a process after its work is done
(SIGABRT, "terminate called without an active exception"; pytorch/pytorch#179291): about once in many runs
under load, so a test that waits for the abort itself rarely sees it. :func:`install` puts a
``sitecustomize`` on the launched processes' ``PYTHONPATH`` that names those threads (read from ``/proc``) at
the start of each process's exit, on every run; :func:`reports` reads the lines back from its stderr.
"""

from __future__ import annotations

import pathlib
import re

_SITECUSTOMIZE = """\
import atexit, glob, os, sys

def _report():
    names = []
    for path in glob.glob("/proc/self/task/*/comm"):
        with open(path) as file:
            names.append(file.read().strip())
    gloo = sorted(name for name in names if "gloo" in name)
    found = "unknown (no /proc)" if not names else gloo
    sys.stderr.write(f"\\nexit report: rank {os.environ.get('RANK', 'none')}: gloo threads {found}\\n")

atexit.register(_report)  # registered first, so it runs after every other exit handler
"""


def install(folder: pathlib.Path) -> str:
    """Write the ``sitecustomize`` into ``folder/exit_report``; returns the folder to put first on PYTHONPATH."""
    target = folder / "exit_report"
    target.mkdir()
    (target / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    return str(target)


def reports(output: str) -> list[tuple[str, str]]:
    """``(rank, gloo threads)`` of each process that exited through the interpreter, sorted (rank "none":
    a process without ``RANK``, such as a launcher); ``"[]"`` means none was left running."""
    return sorted(re.findall(r"^exit report: rank (\w+): gloo threads (.*)$", output, flags=re.MULTILINE))
