"""Repository-wide pytest settings.

`--doctest-modules` (pyproject) imports every collected Python file to look for doctests. The test helpers and
per-directory conftests under tests/ hold no doctests; importing them a second time as plain modules makes
same-named files in sibling test directories clash, so they are left out of collection (pytest still loads
the conftests as conftests).

Property tests (hypothesis) run a fixed, derandomised set of examples by default, with no example database:
the README's test command gives the same result on every run and every machine. To search for new failing
examples, run with random ones: ``python -m pytest --hypothesis-profile=explore`` (a failure prints the
example and a ``@reproduce_failure`` blob; fix the code, then keep the example as a regression test).
Neither profile has a deadline: hypothesis's default fails an example that takes over 200 ms of wall time,
which a busy machine can cause in any test (speed is measured in benchmarks/, never in unit tests).
"""

from hypothesis import settings

collect_ignore_glob = ["tests/*/conftest.py", "tests/*/*_helpers.py", "tests/*/*_worker.py"]

settings.register_profile("deterministic", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", derandomize=False, deadline=None, print_blob=True)
settings.load_profile("deterministic")
