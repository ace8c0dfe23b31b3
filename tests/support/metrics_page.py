"""The job's /metrics as tests read it: scraped over loopback and parsed by prometheus-client's own
text parser; and the metric names the shipped Grafana dashboard queries."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from regen.engine.control.metrics import JobCollector
from regen.engine.job.job import Job
from tests.support.kinds import ROOT

DASHBOARD = ROOT / "dashboards" / "regen.json"
# What the exposition adds to a family's name for each of its samples.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@dataclass
class Page:
    """One scrape: each family's type, and every sample's value by name and labels."""

    types: dict[str, str] = field(default_factory=dict)  # family (a counter's without _total) -> type
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    @property
    def names(self) -> set[str]:
        """Every name a query can use: each family's samples' names, whether or not it has samples now."""
        return {family + suffix for family, kind in self.types.items() for suffix in SUFFIXES[kind]}

    def total(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels` (0 when none)."""
        return sum(v for n, got, v in self.samples if n == name and labels.items() <= got.items())

    def values(self, name: str, **labels: str) -> list[float]:
        return [v for n, got, v in self.samples if n == name and labels.items() <= got.items()]

    def label_values(self, name: str, label: str) -> set[str]:
        return {got[label] for n, got, _ in self.samples if n == name and label in got}


def parse(text: str) -> Page:
    page = Page()
    for family in text_string_to_metric_families(text):
        page.types[family.name] = family.type
        for sample in family.samples:
            page.samples.append((sample.name, dict(sample.labels), float(sample.value)))
    return page


def page_of(job: Job) -> Page:
    """The page the job's /metrics would serve now, rendered without a server."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(job))
    return parse(generate_latest(registry).decode())


async def scrape(address: str) -> Page:
    """GET http://`address`/metrics, as Prometheus would."""
    async with aiohttp.ClientSession() as session, session.get(f"http://{address}/metrics") as resp:
        assert resp.status == 200, resp.status
        assert resp.headers["Content-Type"].startswith("text/plain"), resp.headers["Content-Type"]
        return parse(await resp.text())


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_exprs() -> list[str]:
    """Every query of every panel of dashboards/regen.json."""
    return [target["expr"] for panel in dashboard()["panels"] for target in panel.get("targets", [])]


def queried_names(expr: str) -> set[str]:
    """The metric names a PromQL query reads (regen's own: every name of the page starts regen_)."""
    return set(re.findall(r"\bregen_[a-z0-9_]+", expr))


def dashboard_names() -> set[str]:
    return {name for expr in dashboard_exprs() for name in queried_names(expr)}


def families_table(path: Path) -> dict[str, tuple[str, str]]:
    """docs/metrics.md's table of families: name -> (type, labels as written)."""
    rows: dict[str, tuple[str, str]] = {}
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].startswith("`regen_"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows
