"""`import loopguard` and `import loopguard.signals` must stay light: no torch, no transformers."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "trl", "accelerate", "datasets", "matplotlib")


@pytest.mark.parametrize("module", ["loopguard", "loopguard.signals"])
def test_import_does_not_pull_heavy_dependencies(module):
    code = (
        f"import sys, {module}\n"
        f"heavy = [name for name in {HEAVY!r} if name in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "", f"`import {module}` imported {result.stdout.strip()}"


def test_heavy_modules_are_installed_so_the_check_means_something():
    # The check above only proves something if torch could have been imported; the `test` extra installs it.
    code = "import importlib.util as u; print(u.find_spec('torch') is not None)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.strip() == "True"


def test_public_names_resolve():
    # (ruff's RUF022 keeps each __all__ sorted; this checks every listed name exists.)
    import loopguard
    import loopguard.signals

    for module in (loopguard, loopguard.signals):
        names = list(module.__all__)
        assert len(names) == len(set(names)), f"{module.__name__}.__all__ repeats a name"
        for name in names:
            assert hasattr(module, name), f"{module.__name__}.{name} is listed but missing"
