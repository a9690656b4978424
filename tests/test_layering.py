"""The package is layered one way: signals -> detectors -> guard (control and ladder under it) -> adapters.

Each module may import only its own layer and the layers below it (the shared utilities at the bottom), at
module level or inside a function, so decision logic cannot leak back into the adapters' direction unseen.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "loopguard"

# Lower number = lower layer. A module may import modules of the same or a lower layer only.
LAYERS: dict[str, int] = {
    "loopguard.exceptions": 0,
    "loopguard._types": 0,
    "loopguard._validation": 0,
    "loopguard._saved_state": 0,
    "loopguard._run": 0,
    "loopguard.signals": 1,
    "loopguard.detectors": 2,
    "loopguard.control": 2,
    "loopguard.scoring": 2,
    "loopguard.targeted": 2,  # the ladder's targeted penalty: priced by the Guard, applied by the adapters
    "loopguard.guard": 3,
    "loopguard.log": 4,
    "loopguard._reward_fn": 4,
    "loopguard.shaping": 4,
    "loopguard.checkpoint": 4,
    "loopguard.distill": 4,
    "loopguard.report": 5,
    "loopguard.adapters": 5,
    "loopguard.integrations": 5,
    "loopguard.recipes": 5,
    "loopguard.cli": 6,
    "loopguard": 6,  # the package root re-exports everything
}


def _layer(module: str) -> int:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in LAYERS:
            return LAYERS[name]
    raise KeyError(module)


def _module_name(path: pathlib.Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "loopguard":
                found.update(f"loopguard.{alias.name}" for alias in node.names)
            elif node.module.startswith("loopguard."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("loopguard."))
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_modules_import_only_their_layer_and_below(path):
    module = _module_name(path)
    if module == "loopguard":
        return
    own = _layer(module)
    upward = sorted(
        target
        for target in _imports(path)
        if not target.startswith(module) and _try_layer(target) is not None and _try_layer(target) > own
    )
    assert not upward, f"{module} (layer {own}) imports higher layers: {upward}"


def _try_layer(module: str) -> int | None:
    try:
        return _layer(module)
    except KeyError:
        return None


def test_every_module_has_a_layer():
    unplaced = [_module_name(path) for path in MODULES if _try_layer(_module_name(path)) is None]
    assert not unplaced, f"modules without a layer in tests/test_layering.py: {unplaced}"


def test_the_layer_check_can_fail():
    assert _layer("loopguard.signals._drift") < _layer("loopguard.guard")
    assert _layer("loopguard.adapters.hf_trainer") > _layer("loopguard.guard")
