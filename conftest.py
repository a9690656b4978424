"""Repository-wide pytest settings.

`--doctest-modules` (pyproject) imports every collected Python file to look for doctests. The test helpers and
per-directory conftests under tests/ hold no doctests; importing them a second time as plain modules makes
same-named files in sibling test directories clash, so they are left out of collection (pytest still loads
the conftests as conftests).
"""

collect_ignore_glob = ["tests/*/conftest.py", "tests/*/*_helpers.py", "tests/*/*_worker.py"]
