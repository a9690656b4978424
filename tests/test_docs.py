"""Every ```python block in the README and docs/ runs as written (documentation must not rot)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks():
    for document in DOCUMENTS:
        for index, match in enumerate(BLOCK.finditer(document.read_text())):
            yield pytest.param(match.group(1), id=f"{document.relative_to(ROOT)}#{index}")


BLOCKS = list(_blocks())


def test_readme_has_python_examples():
    assert any("README.md" in block.id for block in BLOCKS)


@pytest.mark.parametrize("source", BLOCKS)
def test_code_block_runs(source, capsys):
    exec(compile(source, "<doc block>", "exec"), {"__name__": "__doc_example__"})


PRIVATE_IMPORT = re.compile(r"^\s*(?:from|import)\s+loopguard(?:\.\w+)*\._\w+", re.MULTILINE)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_docs_import_only_public_modules(document):
    """A user copies what the docs show: every import must name a public module."""
    found = PRIVATE_IMPORT.findall(document.read_text())
    assert not found, f"{document.name} imports private modules: {found}"


def test_the_private_import_check_can_fail():
    assert PRIVATE_IMPORT.search("from loopguard.adapters._distributed import RankSync")
    assert not PRIVATE_IMPORT.search("from loopguard.adapters.distributed import RankSync")
