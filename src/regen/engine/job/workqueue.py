"""What to send next: retries whose backoff has passed first, then fresh prompts in dataset order.

Fresh prompts are pulled lazily from each dataset's file, so a dataset of millions of lines is
never held in memory; only prompts waiting for a retry are.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from regen.engine.data.datasets import Prompt


@dataclass(slots=True)
class WorkItem:
    """A prompt on its way to a row, with its attempt history."""

    prompt: Prompt
    attempts: int = 0  # attempts made for this prompt, earlier runs included (names the rid)
    run_attempts: int = 0  # attempts in this run (the cap applies to these)
    first_started: float | None = None
    last_error: str | None = None


@dataclass(slots=True)
class WorkQueue:
    """Fresh prompts per dataset plus a heap of retries ordered by when they may go."""

    sources: list[tuple[str, Iterator[Prompt]]]
    # dataset -> line -> attempts made in earlier runs (a dict per dataset: a tuple key per line
    # cost twice the memory on a resume of a million prompts, BENCHMARKS.md "Soak")
    prior_attempts: dict[str, dict[int, int]] = field(default_factory=dict)
    _retries: list[tuple[float, int, WorkItem]] = field(default_factory=list)
    _front: list[WorkItem] = field(default_factory=list)
    _seq: Iterator[int] = field(default_factory=itertools.count)

    def push_retry(self, item: WorkItem, ready_at: float) -> None:
        heapq.heappush(self._retries, (ready_at, next(self._seq), item))

    def push_front(self, item: WorkItem) -> None:
        """Put back an item that was taken but could not be sent yet (e.g. the budget gate)."""
        self._front.append(item)

    def take(self, now: float, is_open: Callable[[str], bool]) -> tuple[WorkItem | None, float | None]:
        """The next item to send, or (None, seconds until a retry is due) or (None, None) if empty.

        Items of datasets that `is_open` rejects (their token budget is spent) are dropped.
        """
        while self._front:
            item = self._front.pop()
            if is_open(item.prompt.dataset):
                return item, None
        while self._retries:
            ready_at, _, item = self._retries[0]
            if not is_open(item.prompt.dataset):
                heapq.heappop(self._retries)
                continue
            if ready_at <= now:
                heapq.heappop(self._retries)
                return item, None
            break
        while self.sources:
            name, source = self.sources[0]
            if not is_open(name):
                self.sources.pop(0)
                continue
            prompt = next(source, None)
            if prompt is None:
                self.sources.pop(0)
                continue
            prior = self.prior_attempts.get(prompt.dataset)
            attempts = prior.pop(prompt.line, 0) if prior else 0
            return WorkItem(prompt, attempts=attempts), None
        if self._retries:
            return None, max(0.0, self._retries[0][0] - now)
        return None, None
