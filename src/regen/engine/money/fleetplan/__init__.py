"""Planning and steering one job over both fleets: the GPU hosts first, OpenRouter for the rest.

Pure code, no I/O: the plan (plan.py) and the controller that paces
OpenRouter to finish by the deadline at the least cost (steer.py); the deadline itself is a setting's
type (engine/money/deadline.py), re-exported here. The rules are in docs/fleets.md.
"""

from regen.engine.money.deadline import (
    Deadline,
    DeadlineError,
    Duration,
    TimeOfDay,
    parse_deadline,
    resolve_deadline,
)
from regen.engine.money.fleetplan.plan import (
    FleetPlan,
    Provider,
    Share,
    Work,
    earliest_seconds,
    fill,
    plan_fleets,
)

__all__ = [
    "Deadline",
    "DeadlineError",
    "Duration",
    "FleetPlan",
    "Provider",
    "Share",
    "TimeOfDay",
    "Work",
    "earliest_seconds",
    "fill",
    "parse_deadline",
    "plan_fleets",
    "resolve_deadline",
]
