"""The command line's one edge (cli/edge.py) and the one root of the engine's failures
(engine/errors.py): an operator-facing failure is said as lines with its class's exit code, anything
else keeps its traceback."""

from __future__ import annotations

import errno
import importlib
import inspect
import pkgutil

import pytest

import regen.engine
from regen.cli.edge import guarded
from regen.engine.config.loading import SettingsError
from regen.engine.data.datasets import DatasetError
from regen.engine.errors import EXIT_FAILURE, EXIT_SIGINT, EXIT_USAGE, RegenError, UsageError
from regen.engine.host.errors import HostKeyRefused
from regen.engine.run.state import JobError

# Raised and caught inside one part, always turned into an operator's error there with file:line
# (engine/data/row.py `BadRow` -> RecoveryError, engine/run/records.py `BadRecord` -> RecoveryError).
INTERNAL = {"BadRow", "BadRecord"}


def _raise(exc: BaseException) -> int:
    raise exc


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (RegenError("it failed"), EXIT_FAILURE),
        (JobError("the job cannot start"), EXIT_FAILURE),
        (HostKeyRefused("gpu1: host key refused"), EXIT_FAILURE),
        (UsageError("--host x: no such host"), EXIT_USAGE),
        (SettingsError(["settings.toml:3: job.budget_usd must be positive"]), EXIT_USAGE),
        (DatasetError("A: no prompts.jsonl"), EXIT_USAGE),
    ],
)
def test_an_operators_failure_is_one_line_and_its_classs_exit_code(
    exc: RegenError, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert guarded(lambda: _raise(exc)) == code
    out, err = capsys.readouterr()
    assert out == "" and err == f"regen: {exc}\n"


def test_each_line_of_a_longer_message_is_said_as_regen_and_a_file_error_names_its_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert guarded(lambda: _raise(RegenError("first\nsecond"))) == EXIT_FAILURE
    assert capsys.readouterr().err == "regen: first\nregen: second\n"
    full = OSError(errno.ENOSPC, "No space left on device", "/data/A/raw_responses.jsonl")
    assert guarded(lambda: _raise(full)) == EXIT_FAILURE
    assert capsys.readouterr().err == "regen: /data/A/raw_responses.jsonl: No space left on device\n"
    assert guarded(lambda: _raise(KeyboardInterrupt())) == EXIT_SIGINT
    assert capsys.readouterr().err == ""


def test_a_bug_keeps_its_traceback() -> None:
    with pytest.raises(ZeroDivisionError):
        guarded(lambda: 1 // 0)


def test_every_error_the_engine_defines_is_a_regen_error() -> None:
    """So the edge needs no list of them: a class added without the root is found here."""
    unrooted = []
    for info in pkgutil.walk_packages(regen.engine.__path__, "regen.engine."):
        if ".scripts." in info.name:  # run on the GPU host by its own Python (engine/host/scripts/)
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, Exception)
                and value.__module__ == info.name
                and not name.startswith("_")
                and name not in INTERNAL
                and not issubclass(value, RegenError)
            ):
                unrooted.append(f"{info.name}.{name}")
    assert unrooted == []
