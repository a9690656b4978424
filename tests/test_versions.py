"""The declared floors are the ones the version matrix runs: pyproject's extras against noxfile.py's FLOOR."""

import ast
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins(name):
    """A ``{package: version}`` dict assigned at the top of noxfile.py (read as a literal, nox not imported)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"noxfile.py assigns no {name}")


def _extras():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {extra: [Requirement(r) for r in reqs] for extra, reqs in project["optional-dependencies"].items()}


def _floor(requirement):
    (spec,) = requirement.specifier
    assert spec.operator == ">=", f"{requirement}: a floor is declared as >=, got {spec.operator}"
    return Version(spec.version)


def test_every_third_party_floor_of_the_hf_and_test_extras_is_the_matrix_floor():
    floor = _pins("FLOOR")
    extras = _extras()
    declared = {
        r.name: _floor(r)
        for extra in ("hf", "test")
        for r in extras[extra]
        if r.name in floor  # torch is pinned by the installer; pytest, hypothesis and loopguard are not TRL-facing
    }
    assert declared == {name: Version(version) for name, version in floor.items()}
    assert {r.name for r in extras["hf"]} - set(floor) == {"torch"}  # every hf package but torch has a floor


def test_the_newest_line_is_newer_than_the_floor_everywhere():
    floor, newest = _pins("FLOOR"), _pins("NEWEST")
    assert set(newest) == set(floor)
    for name, version in floor.items():
        assert Version(newest[name]) > Version(version), name


def test_the_readme_table_states_the_floors_and_the_newest_tested():
    section = (ROOT / "README.md").read_text().split("## Supported versions", 1)[1].split("\n## ", 1)[0]
    floor, newest = _pins("FLOOR"), _pins("NEWEST")
    for name in floor:
        assert f"| {name} | {floor[name]} | {newest[name]} |" in section, name
