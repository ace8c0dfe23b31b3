"""One SGLang server the backend sends to (a URL: straight, through its tunnel, or the router's), and
what the job knows of it: its facts from /server_info, its GPUs' meter, its load from /metrics."""

from __future__ import annotations

import time

import aiohttp

from regen.engine.backends.sglang.load import ServerLoad, parse_metrics
from regen.engine.backends.sglang.meter import ShareMeter
from regen.engine.backends.sglang.server import ServerFacts
from regen.engine.backends.sglang.wire import worker_name
from regen.engine.durations import duration
from regen.engine.schema import SGLangServerView

SIGN_POLLS = 2  # /metrics polls unanswered in a row that make a sign of a stall


class Worker:
    """One server URL the backend sends to: its facts, its GPUs' meter, its load, its rids."""

    def __init__(self, url: str, facts: ServerFacts, gpus: int, name: str | None = None) -> None:
        self.url = url
        self.name = name or worker_name(url)
        self.generate_url = url + "/generate"
        self.abort_url = url + "/abort_request"
        self.metrics_url = url + "/metrics"
        self.health_url = url + "/health_generate"
        self.facts = facts
        self.meter = ShareMeter(gpus)
        self.live: set[str] = set()  # rids in flight here
        self.orphans: set[str] = set()  # rids cut off by the transport: aborted once it answers again
        self.load: ServerLoad | None = None
        self.running_peak = 0  # the most requests seen running at once (/metrics)
        self.load_at: float | None = None  # wall clock of the last scrape
        self.retracted_seen: float | None = None
        self.error: str | None = None  # why the last poll failed
        self.down = False
        self.gone = False  # a cluster node's server that left the fleet for good (engine/cluster/fleet.py)
        self.metrics_missing: str | None = None
        self.abort_missing = False
        # A stall's sign (docs/fleets.md, "A stalled fleet"): since when (monotonic) the polls of
        # /metrics have gone unanswered, and how many in a row; None and 0 once one is answered.
        # One alone is no sign: a poll through a tunnel on a loaded host can time out once. (Not a
        # frozen sglang:generation_tokens: SGLang counts a request's tokens only at its finish, so a
        # counter that stands still is the silence itself, docs/sglang.md.)
        self.unanswered_since: float | None = None
        self.unanswered_polls = 0

    def sign_at(self, now: float) -> str | None:
        """This server's own sign of a stall at monotonic `now`, in words, or None."""
        if self.unanswered_since is None or self.unanswered_polls < SIGN_POLLS:
            return None
        return (
            f"{self.name}: /metrics unanswered for {duration(max(0.0, now - self.unanswered_since), 'fine')}"
        )

    @property
    def slots(self) -> int | None:
        """The requests this server runs at once: what it said (/server_info), or more where it
        was seen running more; what was seen where it said nothing; None before either."""
        return max(self.facts.running_slots or 0, self.running_peak) or None

    def view(self) -> SGLangServerView:
        load = self.load
        facts = self.facts
        return {
            "url": self.url,
            "worker": self.name,
            "version": facts.version,
            "served_model_name": facts.served_model_name,
            "model_path": facts.model_path,
            "weight_version": facts.weight_version,
            "gpus": self.meter.gpus,
            "max_running_requests": facts.max_running_requests,
            "context_length": facts.context_length,
            "in_flight": self.meter.in_flight,
            "gpu_s": round(self.meter.busy_gpu_s(), 3),
            "running": None if load is None else load.running,
            "queued": None if load is None else load.queued,
            "kv_usage": None if load is None else load.kv_usage,
            "gen_throughput": None if load is None else load.gen_throughput,
            "retracted_total": None if load is None else load.retracted_total,
            "generation_tokens_total": None if load is None else load.generation_tokens_total,
            "checked_at": self.load_at,
            "down": self.down,
            "error": self.error or self.metrics_missing,
        }

    async def scrape(self, session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout) -> bool:
        """Read this server's /metrics into its load; whether the server answered at all (a sign of
        life, docs/faults.md) even without metrics."""
        asked = time.monotonic()
        try:
            async with session.get(self.metrics_url, timeout=timeout) as resp:
                text = await resp.text()
                status = resp.status
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.down = True
            self.error = f"{self.url} unreachable: {type(exc).__name__}: {exc}"[:200]
            self.unanswered_polls += 1
            if self.unanswered_since is None:
                self.unanswered_since = asked
            return False
        self.down = False
        self.error = None
        self.unanswered_since = None
        self.unanswered_polls = 0
        if status != 200:
            self.metrics_missing = (
                f"no /metrics at {self.url} (HTTP {status}): start the server with --enable-metrics"
            )
            return True
        self.metrics_missing = None
        try:
            load = parse_metrics(text)
        except (ValueError, TypeError) as exc:
            self.metrics_missing = f"unreadable /metrics at {self.url}: {exc}"[:200]
        else:
            self.load = load
            self.load_at = time.time()
            self.running_peak = max(self.running_peak, int(load.running))
        return True
