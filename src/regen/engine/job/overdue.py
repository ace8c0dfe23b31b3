"""Near the deadline, the GPU queue beyond what the GPUs can finish by it (docs/fleets.md, "The end
game: the GPU queue past the deadline").

A prompt a GPU server holds in its queue waits there, where OpenRouter cannot take it. Early in a
run that costs nothing: the GPUs finish far more than they hold before the deadline. In the last
answer times it is the deadline missed by the queue's drain time. So once the GPU rate is measured,
the deadline control bounds what the GPU lanes hold to what the live plan has them make by the
deadline, plus what neither fleet makes by it (late whoever makes it, and free on the GPUs), and
takes the rest back (engine/job/dispatch.py `take_back`, the newest first) for OpenRouter.
"""

from __future__ import annotations

import math

from regen.engine.money.fleetplan.plan import FleetPlan

# Moved to OpenRouter, a prompt must still be answered before the deadline: it is taken back only
# while the time left is this many of OpenRouter's answer times (a request's tokens at its rate).
ANSWER_TIMES_LEFT = 2.0
# The GPU rate is measured once the GPU lanes have made this many rows in the run: from fewer it is
# noise (band 1/sqrt(n) over 0.5), and a bound on it took back all a resumed run's GPU prompts a row
# after its start (the operator's-night journey, answers of 4-12 s smoothed over 2 s).
MEASURED_ROWS = 4
# Noise, not news: what the lanes hold is cut only when it is over the bound by this share of it
# (and by 2 prompts at least); the plan's rates move a little every tick.
SLACK = 0.1


def gpu_hold(plan: FleetPlan, per_prompt_tokens: float, openrouter_answer_s: float) -> int | None:
    """The prompts the GPU lanes should hold in flight now, or None for no bound: no deadline, the
    deadline passed, no work measured per prompt, or too little time left for OpenRouter to make
    what would be taken back (ANSWER_TIMES_LEFT)."""
    left = plan.time_left_s
    if left is None or left <= 0 or per_prompt_tokens <= 0:
        return None
    if left < ANSWER_TIMES_LEFT * openrouter_answer_s:
        return None
    late = max(0, plan.output_tokens - plan.tokens_by_deadline)
    return math.ceil((plan.gpu_tokens + late) / per_prompt_tokens)


def over(held: int, hold: int) -> int:
    """How many of `held` to take back against the bound `hold`: 0 within the slack."""
    excess = held - hold
    return excess if excess >= max(2, math.ceil(SLACK * hold)) else 0


def shares(hold: int, held: list[int]) -> list[int]:
    """`hold` split over the lanes in proportion to what each holds (the measured rate is the
    fleet's; the lanes' in-flight limits already follow their servers' slots). Rounded up: the
    bound errs toward the GPUs, which cost nothing per prompt."""
    total = sum(held)
    if total <= 0:
        return [math.ceil(hold / len(held)) if held else 0 for _ in held]
    return [math.ceil(hold * n / total) for n in held]
