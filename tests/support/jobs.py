"""A job run in the test's own event loop, as `regen run --headless` runs it: prepared, then run."""

from __future__ import annotations

from regen.engine.backends.openrouter.backend import OpenRouterBackend
from regen.engine.config.settings import Settings
from regen.engine.job.job import Job


async def run_job(settings: Settings, **kwargs: object) -> Job:
    """The job on `settings`, run to its end (whatever the outcome); the finished Job."""
    job = Job(settings, **kwargs)  # type: ignore[arg-type]
    await job.prepare()
    await job.run()
    return job


def openrouter(job: Job, lane: int = 0) -> OpenRouterBackend:
    """The job's OpenRouter backend (the Backend protocol does not carry its routes and credits)."""
    backend = job.lanes[lane].backend
    assert isinstance(backend, OpenRouterBackend), backend
    return backend
