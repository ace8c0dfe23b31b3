"""Planning one job over both fleets and pacing it to the deadline: the GPU hosts first, OpenRouter
for the rest.

Pure code, no I/O: the plan (plan.py) and the pacer that sets OpenRouter's in-flight ceiling so the
job finishes by the deadline at the least cost (pacing.py); the deadline itself is a setting's type
(engine/money/deadline.py), re-exported here. The rules are in docs/fleets.md.
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
    RouteOffer,
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
    "RouteOffer",
    "Share",
    "TimeOfDay",
    "Work",
    "earliest_seconds",
    "fill",
    "parse_deadline",
    "plan_fleets",
    "resolve_deadline",
]
