"""Which loopguard lines a run shows: the trainer's log level decides (real TrainingArguments, no training)."""

import logging

import pytest
import transformers
from transformers import TrainingArguments

from loopguard.adapters._console import Console, _process_level


@pytest.fixture
def verbosity():
    """transformers' verbosity, given back after the test (adapter_helpers sets it to ERROR)."""
    before = transformers.logging.get_verbosity()
    yield transformers.logging.set_verbosity
    transformers.logging.set_verbosity(before)


def _args(tmp_path, **kwargs):
    return TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, **kwargs)


@pytest.mark.parametrize(
    ("log_level", "verbosity_level", "expected"),
    [
        ("passive", logging.WARNING, logging.INFO),  # the default: status lines shown
        ("passive", logging.INFO, logging.INFO),
        ("passive", logging.DEBUG, logging.DEBUG),
        ("passive", logging.ERROR, logging.ERROR),  # set_verbosity_error() silences loopguard too
        ("warning", logging.WARNING, logging.WARNING),  # an explicit level is obeyed
        ("error", logging.WARNING, logging.ERROR),
        ("info", logging.ERROR, logging.INFO),
    ],
)
def test_the_trainers_log_level_decides(tmp_path, verbosity, log_level, verbosity_level, expected):
    verbosity(verbosity_level)
    assert _process_level(_args(tmp_path, log_level=log_level)) == expected


class _State:
    is_world_process_zero = True


def test_a_line_goes_to_the_users_handlers_at_the_trainers_level_and_the_loggers_own(tmp_path, verbosity):
    verbosity(logging.WARNING)
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append((record.levelno, record.getMessage()))
    logger = logging.getLogger("loopguard")
    logger.addHandler(handler)
    try:
        console = Console()
        console.open(None, _args(tmp_path, log_level="warning"), _State())
        assert not console.status(logging.INFO, "hidden")
        assert console.status(logging.WARNING, "shown")
        logger.setLevel(logging.ERROR)  # a level on the loopguard logger itself is obeyed as well
        assert not console.status(logging.WARNING, "hidden too")
        assert console.emit(logging.ERROR, "failure", everywhere=True)
        replica = Console()
        replica.open(None, _args(tmp_path, log_level="warning"), type("S", (), {"is_world_process_zero": False}))
        assert not replica.status(logging.ERROR, "status lines come from the main process")
        assert replica.emit(logging.ERROR, "failures from every rank", everywhere=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    assert seen == [
        (logging.WARNING, "shown"),
        (logging.ERROR, "failure"),
        (logging.ERROR, "failures from every rank"),
    ]
