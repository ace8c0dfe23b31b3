"""The journals' schema (engine/run/records.py): every writer makes the line regen has always written,
every reader reads back what its writer wrote, and a journal an older regen wrote reads as it did."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest

from regen.engine.run import records
from regen.engine.run.records import (
    ATTEMPTS,
    EVENTS,
    RecoveryError,
    deadline_event,
    end_record,
    gave_up_record,
    gen_record,
    key_usage_base_event,
    key_usage_void_event,
    on,
    reconciled_record,
    replay,
    requeued_record,
    start_record,
    usage_bound_event,
)
from regen.engine.run.recovery import Unsettled, journal_spend, read_journals

TS = 1700000000.5

# Each writer beside the line the job wrote for it before the schema existed (engine/job/settle.py and
# engine/job/dispatch.py, byte for byte, with the clock at TS).
TODAY: list[tuple[str, Any, bytes]] = [
    (
        "start",
        start_record("A-00000000#0", "A", 0, Decimal("0.0003240"), "openrouter", TS),
        b'{"k":"start","rid":"A-00000000#0","ds":"A","line":0,"reserved":"0.0003240","be":"openrouter","ts":1700000000.5}',
    ),
    ("gen", gen_record("A-00000000#0", "gen-1"), b'{"k":"gen","rid":"A-00000000#0","gen":"gen-1"}'),
    (  # an answer from OpenRouter
        "openrouter answer",
        end_record(
            "A-00000000#0",
            "A",
            0,
            "gen-1",
            "openrouter",
            "ok",
            Decimal("0.0000715"),
            False,
            TS,
            provider="Parasail",
            fields={"model": "m/x", "http": 200},
            ptok=11,
            ctok=30,
            e2e=1.234567,
            ttft=0.123456,
        ),
        b'{"k":"end","rid":"A-00000000#0","ds":"A","line":0,"gen":"gen-1","provider":"Parasail","be":"openrouter",'
        b'"model":"m/x","http":200,"outcome":"ok","cost":"0.0000715","est":false,"ptok":11,"ctok":30,"e2e":1.2346,'
        b'"ttft":0.1235,"ts":1700000000.5}',
    ),
    (  # an answer from SGLang: its only backend field is the status, no first token timed
        "sglang answer",
        end_record(
            "A-00000008#0",
            "A",
            8,
            None,
            "sglang",
            "ok",
            Decimal("2.513000"),
            False,
            TS,
            provider="gpu0",
            fields={"http": 200},
            ptok=11,
            ctok=30,
            e2e=1.234567,
            ttft=None,
        ),
        b'{"k":"end","rid":"A-00000008#0","ds":"A","line":8,"gen":null,"provider":"gpu0","be":"sglang",'
        b'"http":200,"outcome":"ok","cost":"2.513000","est":false,"ptok":11,"ctok":30,"e2e":1.2346,"ttft":null,'
        b'"ts":1700000000.5}',
    ),
    (  # quarantined by the precision guard
        "quarantined",
        end_record(
            "A-00000004#0",
            "A",
            4,
            "gen-1",
            "openrouter",
            "quarantined",
            Decimal("0.0000715"),
            False,
            TS,
            provider="Rogue",
            fields={"model": "m/x", "http": 200},
            ptok=11,
            ctok=30,
            e2e=1.234567,
            ttft=0.123456,
            msg="bad precision",
        ),
        b'{"k":"end","rid":"A-00000004#0","ds":"A","line":4,"gen":"gen-1","provider":"Rogue","be":"openrouter",'
        b'"model":"m/x","http":200,"outcome":"quarantined","cost":"0.0000715","est":false,"ptok":11,"ctok":30,'
        b'"e2e":1.2346,"ttft":0.1235,"ts":1700000000.5,"msg":"bad precision"}',
    ),
    (  # a failure the backend answered
        "failed",
        end_record(
            "A-00000005#0",
            "A",
            5,
            None,
            "openrouter",
            "server",
            Decimal(0),
            False,
            TS,
            provider=None,
            fields={"model": None, "http": 500},
            ptok=None,
            ctok=None,
            e2e=0.01,
            ttft=None,
            msg="Internal Server Error",
        ),
        b'{"k":"end","rid":"A-00000005#0","ds":"A","line":5,"gen":null,"provider":null,"be":"openrouter",'
        b'"model":null,"http":500,"outcome":"server","cost":"0","est":false,"ptok":null,"ctok":null,"e2e":0.01,'
        b'"ttft":null,"ts":1700000000.5,"msg":"Internal Server Error"}',
    ),
    (  # a request that never left
        "never sent",
        end_record(
            "A-00000006#0",
            "A",
            6,
            None,
            "openrouter",
            "network",
            Decimal(0),
            False,
            TS,
            provider=None,
            fields={},
            ptok=None,
            ctok=None,
            e2e=0.01,
            ttft=None,
            msg="refused",
            sent=False,
        ),
        b'{"k":"end","rid":"A-00000006#0","ds":"A","line":6,"gen":null,"provider":null,"be":"openrouter",'
        b'"outcome":"network","cost":"0","est":false,"ptok":null,"ctok":null,"e2e":0.01,"ttft":null,'
        b'"ts":1700000000.5,"msg":"refused","sent":false}',
    ),
    (  # cancelled by a stop
        "cancelled",
        end_record(
            "A-00000001#1",
            "A",
            1,
            "gen-9",
            "openrouter",
            "cancelled",
            Decimal("0.0003240"),
            True,
            TS,
            provider="Parasail",
        ),
        b'{"k":"end","rid":"A-00000001#1","ds":"A","line":1,"gen":"gen-9","provider":"Parasail","be":"openrouter",'
        b'"outcome":"cancelled","cost":"0.0003240","est":true,"ts":1700000000.5}',
    ),
    (  # settled at the next start after a crash
        "crashed",
        end_record(
            "A-00000004#5", "A", 4, None, "openrouter", "lost_at_crash", Decimal("0.03"), True, TS, ctok=0
        ),
        b'{"k":"end","rid":"A-00000004#5","ds":"A","line":4,"gen":null,"be":"openrouter","outcome":"lost_at_crash",'
        b'"cost":"0.03","est":true,"ctok":0,"ts":1700000000.5}',
    ),
    (
        "reconciled",
        reconciled_record(
            "A-00000002#0", "openrouter", "gen-1", "ok", Decimal("0.0001"), Decimal("-0.0002240"), TS
        ),
        b'{"k":"reconciled","rid":"A-00000002#0","be":"openrouter","gen":"gen-1","outcome":"ok","cost":"0.0001",'
        b'"delta":"-0.0002240","ts":1700000000.5}',
    ),
    (
        "reconciled unsent",
        reconciled_record(
            "A-00000006#5", "openrouter", None, "network", Decimal(0), Decimal("-0.025"), TS, unsent=True
        ),
        b'{"k":"reconciled","rid":"A-00000006#5","be":"openrouter","gen":null,"outcome":"network","cost":"0",'
        b'"delta":"-0.025","unsent":true,"ts":1700000000.5}',
    ),
    (
        "gave_up",
        gave_up_record("A", 7, 2, "cut " * 100, TS, "attempts"),
        b'{"k":"gave_up","ds":"A","line":7,"attempts":2,"why":"' + b"cut " * 75 + b'","reason":"attempts",'
        b'"ts":1700000000.5}',
    ),
    (
        "requeued",
        requeued_record(
            "A", 3, "gen-a3", "openrouter", "Together", "ok", Decimal("0.0012"), 40, "fidelity", "drift", TS
        ),
        b'{"k":"requeued","ds":"A","line":3,"gen":"gen-a3","be":"openrouter","provider":"Together","outcome":"ok",'
        b'"cost":"0.0012","ctok":40,"cause":"fidelity","why":"drift","ts":1700000000.5}',
    ),
]

# Each event writer beside the event as EventLog.event wrote it: {"ts", "event", **fields}.
TODAY_EVENTS: list[tuple[Any, dict[str, Any]]] = [
    (
        deadline_event("2h", 7300.0, "1970-01-01T03:01:40+01:00", None, "console", TS),
        {
            "ts": TS,
            "event": "deadline",
            "text": "2h",
            "at": 7300.0,
            "local": "1970-01-01T03:01:40+01:00",
            "setting": None,
            "source": "console",
        },
    ),
    (
        key_usage_base_event("openrouter", Decimal("10.5"), "sk-or-v1-abc", TS),
        {
            "ts": TS,
            "event": "key_usage_base",
            "backend": "openrouter",
            "usage": "10.5",
            "account": "sk-or-v1-abc",
        },
    ),
    (
        key_usage_void_event("openrouter", "the run was resumed with another API key", TS),
        {
            "ts": TS,
            "event": "key_usage_void",
            "backend": "openrouter",
            "reason": "the run was resumed with another API key",
        },
    ),
    (
        usage_bound_event(
            "openrouter",
            base=Decimal(10),
            usage=Decimal("10.01"),
            confirmed=Decimal("0.001"),
            pending=Decimal(0),
            unknowable_before=Decimal("0.025"),
            unknowable_after=Decimal("0.009"),
            count=1,
            cuts={"cancelled": Decimal("0.016")},
            waited_s=3.5,
            ts=TS,
        ),
        {
            "ts": TS,
            "event": "usage_bound",
            "backend": "openrouter",
            "base": "10",
            "usage": "10.01",
            "confirmed": "0.001",
            "pending": "0",
            "unknowable_before": "0.025",
            "unknowable_after": "0.009",
            "count": 1,
            "cuts": {"cancelled": "0.016"},
            "waited_s": 3.5,
        },
    ),
]

READERS = {
    "start": records.read_start,
    "gen": records.read_gen,
    "end": records.read_end,
    "reconciled": records.read_reconciled,
    "gave_up": records.read_gave_up,
    "requeued": records.read_requeued,
    "deadline": records.read_deadline_event,
    "key_usage_base": records.read_key_usage_base_event,
    "key_usage_void": records.read_key_usage_void_event,
    "usage_bound": records.read_usage_bound_event,
}


@pytest.mark.parametrize(("record", "line"), [pytest.param(r, b, id=name) for name, r, b in TODAY])
def test_each_writer_makes_the_line_regen_has_always_written(record: Any, line: bytes) -> None:
    assert orjson.dumps(record) == line


@pytest.mark.parametrize(("record", "event"), [pytest.param(r, e, id=e["event"]) for r, e in TODAY_EVENTS])
def test_each_event_writer_makes_the_event_regen_has_always_written(
    record: Any, event: dict[str, Any]
) -> None:
    assert orjson.dumps(record) == orjson.dumps(event)


@pytest.mark.parametrize(
    ("record", "journal"),
    [pytest.param(r, ATTEMPTS, id=name) for name, r, _ in TODAY]
    + [pytest.param(r, EVENTS, id=r["event"]) for r, _ in TODAY_EVENTS],
)
def test_each_record_reads_back_through_its_kinds_reader_as_written(
    tmp_path: Path, record: Any, journal: records.Journal
) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(orjson.dumps(record) + b"\n")
    kind = record[journal.key]
    seen: list[Any] = []
    replay(path, journal, {kind: on(READERS[kind], seen.append)})
    assert seen == [record]
    assert list(seen[0]) == list(record), "the keys in their order"


def test_a_kind_without_a_handler_is_passed_over_and_a_record_without_a_kind_is_named(tmp_path: Path) -> None:
    path = tmp_path / "attempts.jsonl"
    path.write_bytes(b'{"k":"hold","s":3}\n{"k":"gen","rid":"A-00000000#0","gen":"g"}\n{"rid":"x"}\n')
    seen: list[Any] = []
    with pytest.raises(
        RecoveryError, match=r"attempts\.jsonl:3: not an attempt record \(no kind 'k'\); regen did not"
    ):
        replay(path, ATTEMPTS, {"gen": on(records.read_gen, seen.append)})
    assert seen == [{"k": "gen", "rid": "A-00000000#0", "gen": "g"}]


@pytest.mark.parametrize(
    ("line", "journal", "problem"),
    [
        (
            b'{"k":"start","rid":"r","ds":"A","line":0,"reserved":"1","be":7}',
            ATTEMPTS,
            "start record with a malformed backend",
        ),
        (b'{"k":"end","rid":"r","be":["x"]}', ATTEMPTS, "end record with a malformed backend"),
        (b'{"k":"end","rid":"r","msg":{"a":1}}', ATTEMPTS, "end record with a malformed message"),
        (b'{"k":"reconciled","rid":"r","outcome":3}', ATTEMPTS, "reconciled record with a malformed outcome"),
        (b'{"k":"gave_up","ds":"A"}', ATTEMPTS, "gave_up record without its dataset or line"),
        (
            b'{"k":"requeued","ds":"A","line":1,"outcome":"ok","cause":"fidelity","cost":"x"}',
            ATTEMPTS,
            "requeued record whose cost is not a number",
        ),
        (b'{"event":"deadline","at":1.0,"text":5}', EVENTS, "deadline event with a malformed text"),
        (b'{"event":"exclude","provider":null}', EVENTS, "exclude event without a provider"),
    ],
)
def test_a_reader_names_the_file_line_and_what_is_wrong(
    tmp_path: Path, line: bytes, journal: records.Journal, problem: str
) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(line + b"\n")
    kind = orjson.loads(line)[journal.key]
    reader = READERS.get(kind, records.read_route_event)
    with pytest.raises(RecoveryError, match=rf"journal\.jsonl:1: {problem}; regen did not write this line"):
        replay(path, journal, {kind: on(reader, lambda _: None)})


# -- a journal an older regen wrote ---------------------------------------------------------------
# Lines as earlier regens wrote them: no `be` (single-backend runs), no `outcome` or `be` on a
# reconciled record, amounts as plain numbers, an end record of a refused connection charged at its
# worst case, one already repaired by an `unsent` reconciled record, a cancelled attempt, a crash's
# settlement, a give-up; then a resumed run with both backends naming theirs; then a kind no regen
# reads. The expected values are what the readers before engine/run/records.py returned for it.

OLD_ATTEMPTS = b"""\
{"k":"start","rid":"A-00000000#0","ds":"A","line":0,"reserved":"0.025","ts":1.0}
{"k":"gen","rid":"A-00000000#0","gen":"gen-a0"}
{"k":"end","rid":"A-00000000#0","ds":"A","line":0,"gen":"gen-a0","provider":"Parasail","model":"moonshotai/kimi-k2.5","outcome":"ok","http":200,"cost":"0.0004","est":false,"ptok":11,"ctok":30,"e2e":1.2,"ttft":0.3,"ts":2.0}
{"k":"start","rid":"A-00000001#0","ds":"A","line":1,"reserved":"0.025","ts":1.0}
{"k":"gen","rid":"A-00000001#0","gen":"gen-a1"}
{"k":"end","rid":"A-00000001#0","ds":"A","line":1,"gen":"gen-a1","provider":"Parasail","model":"moonshotai/kimi-k2.5","outcome":"truncated","http":200,"cost":"0.025","est":true,"ptok":11,"ctok":64,"e2e":1.0,"ttft":null,"ts":2.0}
{"k":"reconciled","rid":"A-00000001#0","gen":"gen-a1","cost":"0.0006","delta":"-0.0244","ts":3.0}
{"k":"start","rid":"A-00000002#0","ds":"A","line":2,"reserved":"0.025","ts":1.0}
{"k":"gen","rid":"A-00000002#0","gen":"gen-a2"}
{"k":"start","rid":"A-00000003#0","ds":"A","line":3,"reserved":"0.025","ts":1.0}
{"k":"start","rid":"A-00000004#0","ds":"A","line":4,"reserved":"0.025","ts":1.0}
{"k":"end","rid":"A-00000004#0","ds":"A","line":4,"gen":null,"provider":null,"model":null,"outcome":"network","http":null,"cost":"0.025","est":true,"ptok":null,"ctok":null,"e2e":0.001,"ttft":null,"ts":2.0,"msg":"ClientConnectorError: Cannot connect to host 127.0.0.1:9 ssl:default [Connect call failed ('127.0.0.1', 9)]"}
{"k":"start","rid":"A-00000004#1","ds":"A","line":4,"reserved":"0.025","ts":1.0}
{"k":"end","rid":"A-00000004#1","ds":"A","line":4,"gen":null,"provider":null,"model":null,"outcome":"network","http":null,"cost":"0.025","est":true,"ptok":null,"ctok":null,"e2e":0.001,"ttft":null,"ts":2.0,"msg":"connect timed out"}
{"k":"reconciled","rid":"A-00000004#1","be":"openrouter","gen":null,"outcome":"network","cost":"0","delta":"-0.025","unsent":true,"ts":4.0}
{"k":"start","rid":"A-00000005#0","ds":"A","line":5,"reserved":"0.025","ts":1.0}
{"k":"end","rid":"A-00000005#0","ds":"A","line":5,"gen":null,"provider":null,"outcome":"cancelled","cost":"0.025","est":true,"ts":5.0}
{"k":"start","rid":"A-00000006#0","ds":"A","line":6,"reserved":"0.025","ts":1.0}
{"k":"gen","rid":"A-00000006#0","gen":"gen-a6"}
{"k":"end","rid":"A-00000006#0","ds":"A","line":6,"gen":"gen-a6","outcome":"lost_at_crash","cost":"0.025","est":true,"ctok":0,"ts":6.0}
{"k":"start","rid":"A-00000007#0","ds":"A","line":7,"reserved":"0.025","ts":1.0}
{"k":"end","rid":"A-00000007#0","ds":"A","line":7,"gen":"gen-a7","provider":null,"model":null,"outcome":"server","http":500,"cost":"0","est":false,"ptok":null,"ctok":null,"e2e":0.01,"ttft":null,"ts":7.0,"msg":"Internal Server Error"}
{"k":"start","rid":"A-00000007#1","ds":"A","line":7,"reserved":"0.025","ts":1.0}
{"k":"end","rid":"A-00000007#1","ds":"A","line":7,"gen":"gen-a7b","provider":null,"model":null,"outcome":"server","http":500,"cost":"0","est":false,"ptok":null,"ctok":null,"e2e":0.01,"ttft":null,"ts":7.0,"msg":"Internal Server Error"}
{"k":"gave_up","ds":"A","line":7,"attempts":2,"why":"Internal Server Error","ts":7.0}
{"k":"start","rid":"B-00000000#0","ds":"B","line":0,"reserved":0.025,"ts":1.0}
{"k":"end","rid":"B-00000000#0","ds":"B","line":0,"gen":"gen-b0","provider":"Parasail","outcome":"ok","cost":0.0005,"est":false,"ts":8.0}
{"k":"start","rid":"B-00000001#0","ds":"B","line":1,"reserved":"0.025","be":"openrouter","ts":9.0}
{"k":"gen","rid":"B-00000001#0","gen":"gen-b1"}
{"k":"start","rid":"B-00000002#0","ds":"B","line":2,"reserved":"0","be":"sglang","ts":9.0}
{"k":"end","rid":"B-00000002#0","ds":"B","line":2,"gen":null,"provider":"gpu0","be":"sglang","http":200,"outcome":"ok","cost":"7.5","est":false,"ptok":11,"ctok":40,"e2e":2.5,"ttft":0.1,"ts":10.0}
{"k":"start","rid":"B-00000003#0","ds":"B","line":3,"reserved":"0","be":"sglang","ts":9.0}
{"k":"end","rid":"B-00000001#0","ds":"B","line":1,"gen":"gen-b1","provider":"Parasail","be":"openrouter","model":"moonshotai/kimi-k2.5","http":200,"outcome":"ok","cost":"0.025","est":true,"ptok":11,"ctok":20,"e2e":1.0,"ttft":0.2,"ts":11.0}
{"k":"hold","s":3}
"""

OLD_EVENTS = b"""\
{"ts":100.4,"event":"key_usage_base","backend":"openrouter","usage":"10","account":"sk-or-v1-abc"}
{"ts":100.5,"event":"start","pid":1,"datasets":["A"],"budget":"1","spent":"0","concurrency":8,"excluded":[]}
{"ts":100.6,"event":"exclude","provider":"DeepInfra","source":"console"}
{"ts":100.7,"event":"exclude","provider":"novita","source":null}
{"ts":100.8,"event":"include","provider":"novita","source":"operator"}
{"ts":101.0,"event":"deadline","text":"2h","at":7300.0,"local":"1970-01-01T03:01:40+01:00","setting":null,"source":"console"}
{"ts":200.0,"event":"start","pid":2,"datasets":["A","B"],"budget":"1","spent":"0.02","concurrency":8,"excluded":["deepinfra"],"backends":["sglang","openrouter"]}
{"ts":200.1,"event":"exclude","provider":"gpu1","source":"operator","backend":"sglang"}
{"ts":300.0,"event":"usage_bound","backend":"openrouter","base":"10","usage":"10.01","confirmed":"0.001","pending":"0","unknowable_before":"0.025","unknowable_after":"0.009","count":1,"cuts":{"cancelled":"0.016"},"waited_s":3.5}
"""


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    (tmp_path / "attempts.jsonl").write_bytes(OLD_ATTEMPTS)
    (tmp_path / "events.jsonl").write_bytes(OLD_EVENTS)
    return tmp_path


def test_a_journal_an_older_regen_wrote_reads_as_it_always_did(old_run: Path) -> None:
    attempts, events = old_run / "attempts.jsonl", old_run / "events.jsonl"
    paid = read_journals(attempts, events, backend="openrouter", default="openrouter")
    # 0.0004 + (0.025 - 0.0244) + 0.025 + (0.025 - 0.025 unsent) + 0.025 + 0.025 + 0 + 0 + 0.0005 + 0.025,
    # less the key's usage bound of 0.016.
    assert paid.spent == Decimal("0.0855")
    assert paid.attempts == {
        "A": {0: 1, 1: 1, 2: 1, 3: 1, 4: 2, 5: 1, 6: 1, 7: 2},
        "B": {0: 1, 1: 1, 2: 1, 3: 1},
    }
    assert paid.crashed == [
        Unsettled("A-00000002#0", "A", 2, "gen-a2", Decimal("0.025")),
        Unsettled("A-00000003#0", "A", 3, None, Decimal("0.025")),
    ]
    assert paid.to_reconcile == [
        Unsettled("A-00000006#0", "A", 6, "gen-a6", Decimal("0.025"), "lost_at_crash"),
        Unsettled("B-00000001#0", "B", 1, "gen-b1", Decimal("0.025"), "ok", "Parasail"),
    ]
    # The refused connection charged at its worst case is repaired at the next start; the one an
    # `unsent` record repaired already is not repaired twice.
    assert paid.never_sent == [Unsettled("A-00000004#0", "A", 4, None, Decimal("0.025"), "network")]
    assert paid.estimates.pending == Decimal("0.050") and paid.estimates.pending_count == 2
    assert paid.estimates.unknowable == Decimal("0.034") and paid.estimates.unknowable_count == 2
    assert paid.estimates.unknowable_by == {"network": Decimal("0.025"), "cancelled": Decimal("0.009")}
    assert paid.estimates.bounded_by == "key_usage"
    # A reconciled record without `outcome` corrects the crash's share, as it always has.
    assert paid.breakdown.useful == Decimal("0.0259") and paid.breakdown.useful_tokens == 50
    assert paid.breakdown.waste == {
        "retries": Decimal("0.025"),
        "truncated": Decimal("0.025"),
        "quarantined": Decimal(0),
        "crash": Decimal("0.0006"),
        "cancelled": Decimal("0.009"),
        "fidelity": Decimal(0),
        "audit": Decimal(0),
        "taken_back": Decimal(0),
    }
    assert paid.excluded == {"deepinfra": "console"}
    assert paid.usage_base == Decimal(10) and paid.usage_account == "sk-or-v1-abc"
    assert paid.first_start_ts == 100.5 and paid.begun
    assert paid.deadline is not None and paid.deadline["at"] == 7300.0 and paid.deadline["text"] == "2h"

    gpus = read_journals(attempts, events, backend="sglang", default="openrouter", count_attempts=False)
    assert gpus.spent == Decimal("7.5") and gpus.attempts == {}
    assert gpus.crashed == [Unsettled("B-00000003#0", "B", 3, None, Decimal(0))]
    assert gpus.to_reconcile == gpus.never_sent == []
    assert gpus.excluded == {"gpu1": "operator"} and gpus.usage_base is None
    assert gpus.breakdown.useful == Decimal("7.5") and gpus.breakdown.useful_tokens == 40

    everything = read_journals(attempts, events)
    assert everything.spent == Decimal("7.5855")
    assert everything.excluded == {"deepinfra": "console", "gpu1": "operator"}


def test_verify_reads_an_older_journals_dollars_per_dataset(old_run: Path) -> None:
    spend = journal_spend(old_run / "attempts.jsonl")
    # The GPU-seconds of the sglang attempt are not dollars; the usage bound is the job's, not the rows'.
    assert spend == {"A": pytest.approx(0.076), "B": pytest.approx(0.0255)}
