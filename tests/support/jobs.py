"""A job run in the test's own event loop, as `regen run --headless` runs it: prepared, then run."""

from __future__ import annotations

from regen.engine.config.settings import Settings
from regen.engine.job.job import Job


async def run_job(settings: Settings, **kwargs: object) -> Job:
    """The job on `settings`, run to its end (whatever the outcome); the finished Job."""
    job = Job(settings, **kwargs)  # type: ignore[arg-type]
    await job.prepare()
    await job.run()
    return job
