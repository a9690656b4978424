"""The version matrix: loopguard's TRL-facing tests on the oldest and the newest supported TRL line.

Each session makes a fresh virtual environment, installs ``torch==2.13.0`` first (the CPU wheel; an unpinned
torch would pull a multi-GB CUDA build), then loopguard with its ``test`` extra and the line's exact pins,
checks that the pins are what got installed, and runs the TRL-facing tests::

    nox -s "adapters(trl='floor')"     # pyproject's floors: trl 1.0.0, transformers 4.56.2, ...
    nox -s "adapters(trl='newest')"    # the newest versions verified
    nox                                # both
    nox -s "adapters(trl='floor')" -- tests/adapters/test_grpo.py -x   # other pytest arguments

``FLOOR`` equals the ``>=`` floors of pyproject's ``hf`` and ``test`` extras (tests/test_versions.py checks
that). Raise ``NEWEST`` when a newer release passes.
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"  # the standard library's: its pip reads the machine's pip config

TORCH = "torch==2.13.0"

# The oldest versions that install together and pass. TRL 1.0 itself needs transformers >= 4.56.2,
# accelerate >= 1.4 and datasets >= 4.7; safetensors 0.4.3 cannot read a checkpoint file of empty tensors;
# TensorBoard before 2.18 breaks on numpy 2. README "Supported versions" says what failed below these.
FLOOR = {
    "trl": "1.0.0",
    "transformers": "4.56.2",
    "accelerate": "1.4.0",
    "datasets": "4.7.0",
    "safetensors": "0.4.4",
    "peft": "0.13.0",
    "tensorboard": "2.18.0",
}

NEWEST = {
    "trl": "1.16.0",
    "transformers": "5.24.0",
    "accelerate": "1.15.0",
    "datasets": "5.2.0",
    "safetensors": "0.8.0",
    "peft": "0.21.2",
    "tensorboard": "2.21.0",
}

LINES = {"floor": FLOOR, "newest": NEWEST}

# Every test that drives TRL, transformers, Accelerate or PEFT code: the adapters on real TRL trainers (GRPO,
# RLOO, online DPO, DPO), shape_reward against TRL's reward-function rules, the docs' recipe scripts, the
# 2-process GRPO and Accelerate runs, and iterative DPO (TRL's DPOTrainer, PEFT adapters).
TESTS = (
    "tests/adapters",
    "tests/test_shaping.py",
    "tests/test_recipes.py",
    "tests/distributed",
    "tests/recipes",
    # sharded checkpoints use torch and DeepSpeed only (torch is pinned alike on both lines): run once, in CI
    "--ignore=tests/distributed/test_fsdp2.py",
    "--ignore=tests/distributed/test_deepspeed.py",
)

_CHECK = """
import sys
from importlib.metadata import version

wanted = dict(arg.split("==") for arg in sys.argv[1:])
found = {name: version(name).split("+")[0] for name in wanted}  # torch 2.13.0+cpu is 2.13.0
print("installed:", ", ".join(f"{name} {found[name]}" for name in wanted))
wrong = {name: (found[name], pin) for name, pin in wanted.items() if found[name] != pin}
if wrong:
    sys.exit(f"not the pinned versions (installed, pinned): {wrong}")
"""


@nox.session
@nox.parametrize("trl", list(LINES))
def adapters(session: nox.Session, trl: str) -> None:
    """TRL-facing tests on one TRL line: 'floor' (pyproject's floors) or 'newest' (the newest verified)."""
    pins = [f"{name}=={version}" for name, version in LINES[trl].items()]
    session.env.update({"HF_HUB_OFFLINE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    session.install(TORCH)
    session.install("-e", ".[test]", *pins)
    session.run("python", "-c", _CHECK, TORCH, *pins)
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *(session.posargs or TESTS))


# verl pins transformers < 5.11 and pulls Ray, so it gets an environment of its own. Its trainer module
# imports cachetools, fastapi and uvicorn without declaring them (verl 0.9.1).
VERL = "verl==0.9.1"
VERL_UNDECLARED = ("cachetools", "fastapi", "uvicorn")


@nox.session
def verl(session: nox.Session) -> None:
    """GuardedKLController driven through verl's own KL-controller factory and apply_kl_penalty (CPU)."""
    session.env.update({"HF_HUB_OFFLINE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    session.install(TORCH)
    session.install(VERL, *VERL_UNDECLARED)
    session.install("-e", ".", "pytest>=8", "hypothesis>=6.100")
    session.run("python", "-c", _CHECK, TORCH, VERL)
    session.run(
        "python",
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        *(session.posargs or ("tests-engines/verl",)),
    )
