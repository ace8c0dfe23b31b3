"""/metrics without a running job: the setting, what is opened and what is not, the families'
documentation and the dashboard's queries. A real job's page is tests/integration/backends/test_metrics.py."""

from __future__ import annotations

import io
import os
import socket
from pathlib import Path

import pytest

from regen.cli.main import main
from regen.engine.config.loading import SettingsError, load_settings
from regen.engine.config.settings import JobSettings, MetricsSettings, Settings
from regen.engine.control.headless import open_metrics
from regen.engine.control.metrics import FAMILIES
from regen.engine.errors import EXIT_USAGE
from regen.engine.job.job import Job
from regen.engine.job.stats import Buckets
from tests.support.kinds import ROOT
from tests.support.metrics_page import SUFFIXES, dashboard, dashboard_exprs, families_table, queried_names
from tests.support.processes import free_port


def listening() -> dict[int, str]:
    """This process's listening TCP sockets: inode -> local address as /proc/net/tcp writes it."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(int(target[8:-1]))
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[9]) in mine:  # 0A: LISTEN
                found[int(fields[9])] = fields[1]
    return found


def job_with(tmp_path: Path, listen: str | None) -> Job:
    return Job(Settings(job=JobSettings(run_dir=tmp_path / "run"), metrics=MetricsSettings(listen=listen)))


def test_a_bad_listen_address_is_one_line_naming_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "settings.toml"
    for bad, said in (
        ("localhost:http", "is not an address to listen on like 127.0.0.1:9464"),
        ("http://127.0.0.1:9464", "is not an address to listen on"),
        ("::1:9464", "an IPv6 address goes in brackets"),
        ("127.0.0.1:70000", "the port must be 1-65535"),
    ):
        path.write_text(f'[metrics]\nlisten = "{bad}"\n')
        with pytest.raises(SettingsError) as caught:
            load_settings(path)
        [problem] = caught.value.problems
        assert problem.startswith(f"{path}: metrics.listen: {bad!r}") and said in problem, problem
        assert main(["run", "--headless", "--settings", str(path)]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert (
            err.count("\n") == 1
            and err.startswith(f"regen: {path}: metrics.listen: ")
            and "Traceback" not in err
        )


def test_a_port_alone_listens_on_loopback_and_an_address_is_kept_as_given() -> None:
    assert MetricsSettings(listen="9464").address == ("127.0.0.1", 9464)
    assert MetricsSettings(listen=":9464").listen == "127.0.0.1:9464"
    assert MetricsSettings(listen="0.0.0.0:9464").address == ("0.0.0.0", 9464)
    assert MetricsSettings(listen="[::1]:9464").address == ("::1", 9464)
    assert MetricsSettings().address is None and MetricsSettings(listen=" ").address is None


async def test_metrics_are_off_by_default_and_open_no_port(tmp_path: Path) -> None:
    before = listening()
    out = io.StringIO()
    assert await open_metrics(job_with(tmp_path, None), out) is None
    assert listening() == before and out.getvalue() == ""


async def test_a_port_alone_is_bound_to_loopback_only(tmp_path: Path) -> None:
    before = listening()
    port = free_port()
    out = io.StringIO()
    server = await open_metrics(job_with(tmp_path, str(port)), out)
    assert server is not None
    try:
        opened = {inode: address for inode, address in listening().items() if inode not in before}
        assert list(opened.values()) == [f"0100007F:{port:04X}"], "127.0.0.1 only, not every interface"
        assert out.getvalue() == f"metrics: http://127.0.0.1:{port}/metrics\n"
    finally:
        await server.close()
    assert listening() == before, "closed with the job"


async def test_an_address_in_use_is_said_once_and_the_job_goes_on_without_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = io.StringIO()
        assert await open_metrics(job_with(tmp_path, f"127.0.0.1:{port}"), out) is None
    said = out.getvalue()
    assert said.count("\n") == 1, said
    assert said.startswith(f"regen: warning: metrics.listen: cannot listen on 127.0.0.1:{port} (")
    assert said.rstrip().endswith("; no /metrics this run")


def test_a_value_on_a_bucket_bound_counts_in_that_bucket() -> None:
    buckets = Buckets((0.5, 1.0))
    for value in (0.1, 0.5, 0.7, 1.0, 3.0):
        buckets.add(value)
    assert buckets.cumulative() == [("0.5", 2), ("1.0", 4), ("+Inf", 5)]
    assert buckets.total == pytest.approx(5.3)


def test_docs_list_every_family_with_its_type_and_labels() -> None:
    table = families_table(ROOT / "docs" / "metrics.md")
    assert table == {f.name: (f.kind, ", ".join(f.labels) or "-") for f in FAMILIES}
    for f in FAMILIES:
        assert f.name.startswith("regen_") and (f.kind != "counter") == (not f.name.endswith("_total")), (
            f.name
        )
        assert "usd" not in f.name and ("dollar" not in f.name or f.name.endswith("_dollars")), f.name


def test_the_dashboard_queries_only_families_the_page_has() -> None:
    exposed = {f.name.removesuffix("_total") + suffix for f in FAMILIES for suffix in SUFFIXES[f.kind]}
    exprs = dashboard_exprs()
    assert len(exprs) >= 20
    for expr in exprs:
        names = queried_names(expr)
        assert names, f"a query of nothing of regen's: {expr}"
        assert names <= exposed, f"{sorted(names - exposed)} in {expr}"
    board = dashboard()
    assert board["schemaVersion"] >= 39
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24 and pos["y"] + pos["h"] <= 28, (
            f"{panel['title']} is off the one screen"
        )
        here = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & here, f"{panel['title']} overlaps another panel"
        cells |= here
    titles = " ".join(p["title"].lower() for p in board["panels"])
    for topic in ("throughput", "budget", "burn", "latency", "errors", "fleets", "deadline"):
        assert topic in titles, topic
