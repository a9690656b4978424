"""`import loopguard` stays torch-free; `loopguard.distill` without torch names the `hf` extra."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)


def test_import_loopguard_does_not_import_torch_or_distill():
    done = _run("import sys, loopguard; print('torch' in sys.modules, 'loopguard.distill' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_missing_torch_names_the_hf_extra():
    code = (
        "import sys\n"
        "import loopguard\n"
        "from loopguard.exceptions import MissingDependencyError\n"
        "sys.modules['torch'] = None  # makes `import torch` fail like an absent package\n"
        "try:\n"
        "    import loopguard.distill\n"
        "except MissingDependencyError as error:\n"
        "    print(error)\n"
    )
    done = _run(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loopguard.distill needs the `hf` extra: pip install 'loopguard[hf]'"
