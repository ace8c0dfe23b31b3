"""The key's usage as a bound on the money no bill can name (docs/money.md, "Bounded by the key's usage").

An attempt cut before its handle arrived (a SIGKILL, a cancel before the response headers) is kept
at its worst case, as no per-attempt bill can ever name it. The account's own usage can still bound
them all together: at the run's first start, before anything was sent, the usage is journaled as the
base (`key_usage_base`); at the end of a run that drained, once the usage has settled, whatever the
key was billed since is an upper bound of the job's own bills, so the unknowable money can be at
most that less the confirmed bills. The cut is journaled (`usage_bound`) and recovery applies it.
"""

from __future__ import annotations

import time

from regen.engine.backends.base import Account, AccountUsage
from regen.engine.job.settle import Settler
from regen.engine.money.ledger import Ledger
from regen.engine.run.events import EventLog
from regen.engine.run.records import key_usage_base_event, key_usage_void_event, usage_bound_event
from regen.engine.run.recovery import JournalState

KEY_USAGE = "key_usage"


class UsageBound:
    """One lane's base and, at the end of a run, its bound: for a backend with an account (engine/backends/base.py
    `Account`)."""

    def __init__(self, account: Account, settler: Settler, events: EventLog, journal: JournalState) -> None:
        self.account = account
        self.settler = settler
        self.backend = settler.backend.name
        self.events = events
        self.journal = journal
        self.base = journal.usage_base
        self.key = journal.usage_account  # which key the base is of (a fingerprint)

    async def begin(self) -> None:
        """At the run's first start, journal the base; at a later one under another key, void it
        (the figures of the new key do not count what the old one was billed)."""
        if self.journal.begun and self.base is None:
            return  # an older run, or /key unreadable at the first start: no bound, ever
        reading = await self.account.account_usage(settle=False)
        if not self.journal.begun:
            if reading.usage is not None:
                self.base, self.key = reading.usage, reading.account
                self.events.write(
                    key_usage_base_event(self.backend, reading.usage, reading.account, time.time())
                )
        elif reading.account != self.key:
            self.base = self.key = None
            self.events.write(
                key_usage_void_event(self.backend, "the run was resumed with another API key", time.time())
            )

    async def end(self) -> None:
        """After the run drained and its lookups ended: bound the unknowable money by the usage."""
        ledger = self.settler.ledger
        if self.base is None or ledger.estimates.unknowable <= 0:
            return
        reading = await self.account.account_usage(settle=True)
        why = self._refusal(reading, ledger)
        if why is not None:
            self.events.event("usage_unbounded", backend=self.backend, reason=why, waited_s=reading.waited_s)
            return
        assert reading.usage is not None and self.base is not None
        since_base = reading.usage - self.base
        estimates = ledger.estimates
        before, confirmed, pending = estimates.unknowable, ledger.confirmed, estimates.pending
        cuts = ledger.usage_cuts(since_base)
        if cuts:
            ledger.lower_unknowable(cuts, KEY_USAGE)
            for outcome, cut in cuts.items():
                self.settler.breakdown.add(outcome, -cut)
        estimates.bound_waited_s = reading.waited_s
        self.events.write(
            usage_bound_event(
                self.backend,
                base=self.base,
                usage=reading.usage,
                confirmed=confirmed,
                pending=pending,
                unknowable_before=before,
                unknowable_after=estimates.unknowable,
                count=estimates.unknowable_count,
                cuts=cuts,
                waited_s=reading.waited_s,
                ts=time.time(),
            )
        )

    def _refusal(self, reading: AccountUsage, ledger: Ledger) -> str | None:
        """Why this reading cannot bound the money honestly, or None."""
        if reading.usage is None:
            return "the key's usage could not be read"
        if reading.account != self.key:
            return "the API key is not the one the run's first start read the usage of"
        if not reading.settled:
            return f"the key's usage was still changing after {reading.waited_s:.0f} s"
        assert self.base is not None
        if reading.usage - self.base < ledger.confirmed:
            # The key cannot be the one these bills went to (or its usage counts them elsewhere):
            # the premise of the bound fails, so it is not applied.
            return "the key's usage grew by less than the job's confirmed bills"
        return None


__all__ = ["KEY_USAGE", "UsageBound"]
