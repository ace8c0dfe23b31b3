"""The job's states and outcomes, and the live progress of each dataset."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from regen.engine.data.datasets import Dataset
from regen.engine.errors import EXIT_FAILURE, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, RegenError
from regen.engine.run.recovery import DatasetProgress


class JobError(RegenError, RuntimeError):
    """The job cannot start or go on; the message says why, for the operator."""


class JobState(StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    DRAINING = "DRAINING"
    STOPPED = "STOPPED"
    DONE = "DONE"


class StopReason(StrEnum):
    DONE = "done"
    BUDGET = "budget"
    CREDITS = "credits"
    FATAL = "fatal"
    FAILED_PROMPTS = "failed_prompts"
    WRITE_FAILED = "write_failed"
    OPERATOR = "operator"
    SIGINT = "sigint"
    SIGTERM = "sigterm"


@dataclass(slots=True)
class DatasetState:
    """Live progress of one dataset."""

    dataset: Dataset
    total: int
    invalid: int
    progress: DatasetProgress
    in_flight: int = 0
    failed: int = 0
    token_budget: int | None = None
    prompt_tokens_mean: float = 0.0

    @property
    def done(self) -> int:
        return len(self.progress.done)

    @property
    def remaining(self) -> int:
        return self.total - self.invalid - self.done

    @property
    def budget_reached(self) -> bool:
        return self.token_budget is not None and self.progress.output_tokens >= self.token_budget

    @property
    def state(self) -> str:
        if self.remaining <= 0:
            return "done"
        if self.budget_reached:
            return "token budget"
        if self.in_flight:
            return "running"
        return "failed" if self.failed and self.remaining <= self.failed else "waiting"


@dataclass(slots=True)
class Outcome:
    """How a run ended, for the exit code and the last line."""

    reason: StopReason
    message: str

    @property
    def exit_code(self) -> int:
        codes = {StopReason.DONE: EXIT_OK, StopReason.SIGINT: EXIT_SIGINT, StopReason.SIGTERM: EXIT_SIGTERM}
        return codes.get(self.reason, EXIT_FAILURE)
