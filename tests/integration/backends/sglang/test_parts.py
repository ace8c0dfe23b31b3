"""The SGLang backend's parts on their own: the stream tail, the GPU-share meter, the metrics reader,
the concurrency rule and the failure table."""

from __future__ import annotations

import random
from pathlib import Path
from typing import cast

import aiohttp
import orjson
import pytest
from aiohttp.client_reqrep import ConnectionKey

from regen.engine.backends.base import Disposition
from regen.engine.backends.sglang import errors
from regen.engine.backends.sglang.load import (
    Capacity,
    Health,
    ServerLoad,
    capacity,
    next_ceiling,
    parse_metrics,
)
from regen.engine.backends.sglang.meter import ShareMeter
from regen.engine.backends.sglang.server import ServerFacts, running_slots
from regen.engine.backends.sglang.wire import (
    StreamTail,
    finish_type,
    read_answer,
    sampling_params,
    worker_name,
)
from regen.engine.backends.sglang.worker import Worker
from regen.engine.data.tokenizer import TargetTokenizer, TokenizerSpec
from regen.engine.job.concurrency import AdaptiveLimit
from regen.sim.sglang.server import SGLangSim
from tests.support.tokenizers import build_tokenizer


def chunk(n: int, finish: object = None) -> bytes:
    ids = list(range(n))
    meta = {"id": "A-1#0", "finish_reason": finish, "completion_tokens": n}
    return b"data: " + orjson.dumps({"text": "x" * n, "output_ids": ids, "meta_info": meta}) + b"\n\n"


def stream(n: int) -> bytes:
    body = b"".join(chunk(k) for k in range(1, n))
    return body + chunk(n, {"type": "stop", "matched": n - 1}) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("seed", range(20))
def test_stream_tail_keeps_the_last_chunk_however_the_bytes_are_split(seed: int) -> None:
    raw = stream(40)
    rng = random.Random(seed)
    tail = StreamTail()
    at = 0
    while at < len(raw):
        step = rng.randint(1, 700)
        tail.feed(raw[at : at + step])
        at += step
    tail.finish()
    assert tail.done
    answer = read_answer(tail.last or b"")
    assert answer.output_ids == list(range(40))
    assert finish_type(answer.finish) == "stop"
    assert len(tail._pending) == 0


def test_stream_tail_reads_whole_events_in_place() -> None:
    events = [chunk(k) for k in range(1, 6)] + [chunk(6, {"type": "stop", "matched": 5}), b"data: [DONE]\n\n"]
    for grouping in (1, 2, 3, 7):
        tail = StreamTail()
        for at in range(0, len(events), grouping):
            tail.feed(b"".join(events[at : at + grouping]))
        tail.finish()
        assert tail.done and read_answer(tail.last or b"").output_ids == list(range(6)), grouping
    tail = StreamTail()
    tail.feed(chunk(1) + chunk(2)[:10])  # a whole event, then the start of the next one
    tail.feed(chunk(2)[10:] + b"data: [DONE]\n\n")
    assert tail.done and read_answer(tail.last or b"").output_ids == [0, 1]


def test_stream_tail_cut_before_the_final_chunk_and_error_events() -> None:
    tail = StreamTail()
    raw = stream(10)
    tail.feed(raw[: raw.index(b'"type"') - 40])  # cut inside the final chunk
    tail.finish()
    answer = read_answer(tail.last or b"")
    assert not tail.done and answer.finish is None and len(answer.output_ids) == 9
    # The router reports a worker that died mid-stream as an error event, then [DONE].
    tail = StreamTail()
    tail.feed(chunk(3) + b'data: {"error": {"message": "Stream error: EOF", "type": "stream_error"}}\n\n')
    tail.feed(b"data: [DONE]\n\n")
    answer = read_answer(tail.last or b"")
    assert tail.done and answer.error is not None
    failure = errors.for_stream_error(answer.error, "http://h:1")
    assert failure.disposition is Disposition.RETRY and "Stream error: EOF" in failure.message
    # An event left without its blank line at the close still counts.
    tail = StreamTail()
    tail.feed(chunk(2, {"type": "length", "length": 2})[:-1])
    tail.finish()
    assert finish_type(read_answer(tail.last or b"").finish) == "length"
    with pytest.raises(ValueError):
        read_answer(b"[1, 2]")


def test_sampling_params_and_worker_names() -> None:
    assert sampling_params(100, 1.0, None, 7) == {
        "max_new_tokens": 100,
        "temperature": 1.0,
        "stop_token_ids": [7],
        "skip_special_tokens": False,
        "stream_interval": 4,  # about 32 chunks for a full-length answer
    }
    assert worker_name("http://127.0.0.1:30000") == "127.0.0.1:30000"
    assert worker_name("https://gpu-1.lan") == "gpu-1.lan:443"
    assert worker_name("http://[::1]:8000/") == "[::1]:8000"


def test_the_meter_shares_gpus_and_sums_to_the_busy_time() -> None:
    meter = ShareMeter(8, now=0.0)
    a = meter.enter(0.0)  # alone for 1 s: 8 GPU-s
    b = meter.enter(1.0)  # shared for 2 s: 8 GPU-s each
    charge_a = meter.leave(a, 3.0)
    charge_b = meter.leave(b, 4.0)  # alone again for 1 s
    assert charge_a == pytest.approx(16.0)
    assert charge_b == pytest.approx(16.0)
    meter.enter(10.0)  # idle from 4 to 10: nobody is charged for it
    assert meter.busy_gpu_s(11.0) == pytest.approx(8 * 5.0)
    rng = random.Random(3)
    meter = ShareMeter(4, now=0.0)
    open_marks: list[float] = []
    total = 0.0
    now = 0.0
    for _ in range(2000):
        now += rng.random()
        if open_marks and rng.random() < 0.5:
            total += meter.leave(open_marks.pop(rng.randrange(len(open_marks))), now)
        else:
            open_marks.append(meter.enter(now))
    now += 1
    while open_marks:
        total += meter.leave(open_marks.pop(), now)
    assert total == pytest.approx(meter.busy_gpu_s(now), rel=1e-9)


async def test_metrics_are_read_from_the_simulators_text(sim: SGLangSim) -> None:
    async with aiohttp.ClientSession() as session, session.get(sim.base_url + "/metrics") as resp:
        text = await resp.text()
    load = parse_metrics(text)
    state = sim.state()
    assert load.running == state["running"] and load.queued == state["queued"]
    assert load.kv_usage == pytest.approx(state["kv_used_tokens"] / state["max_total_tokens"])
    assert load.requests_total == state["counters"]["requests"]
    assert load.generation_tokens_total == state["counters"]["generation_tokens"]
    # Several workers' series in one text (a router's merge): queues add up, KV usage is the worst;
    # other TP ranks repeat rank 0 and are not counted twice.
    merged = """# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m",tp_rank="0",worker_addr="a"} 3.0
sglang:num_queue_reqs{model_name="m",tp_rank="0",worker_addr="b"} 4.0
sglang:num_queue_reqs{model_name="m",tp_rank="1",worker_addr="b"} 4.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0",worker_addr="a"} 0.5
sglang:token_usage{model_name="m",tp_rank="0",worker_addr="b"} 0.9
"""
    both = parse_metrics(merged)
    assert (both.queued, both.kv_usage) == (7.0, 0.9)


HEALTH = Health(queue_min=100, queue_max=2000, kv_usage_max=0.95)


def test_the_ceiling_keeps_the_queue_in_its_band() -> None:
    deep = ServerLoad(running=256, queued=3000, kv_usage=0.5)
    ceiling, why = next_ceiling([(deep, 0)], 3256, None, 5000, HEALTH)
    assert ceiling == 3256 - 1000 and "3000 queued" in why
    healthy = ServerLoad(running=256, queued=500, kv_usage=0.9)
    assert next_ceiling([(healthy, 0)], 756, 2256, 5000, HEALTH)[0] == 2256, "in the band: unchanged"
    short = ServerLoad(running=256, queued=10, kv_usage=0.5)
    grown, _ = next_ceiling([(short, 0)], 266, 266, 5000, HEALTH)
    assert grown == 266 + 90, "grows to the band's floor"
    capped, _ = next_ceiling([(short, 0)], 266, 200, 5000, HEALTH)
    assert capped == 300, "at most half again per scrape"
    assert next_ceiling([(short, 0)], 266, None, 5000, HEALTH)[0] is None, "no ceiling: no opinion"
    assert next_ceiling([(short, 0)], 4990, 4990, 5000, HEALTH)[0] is None, "reaching the operator's limit"
    full = ServerLoad(running=256, queued=600, kv_usage=0.97)
    lowered, why = next_ceiling([(full, 0)], 856, None, 5000, HEALTH)
    assert lowered == 356 and "KV usage" in why
    retracting = ServerLoad(running=256, queued=600, kv_usage=0.5)
    lowered, why = next_ceiling([(retracting, 3)], 856, 900, 5000, HEALTH)
    assert lowered == 356 and "retracted" in why
    assert next_ceiling([(ServerLoad(queued=50, kv_usage=0.99), 0)], 300, 300, 5000, HEALTH)[0] == 300, (
        "a full KV pool with a short queue: hold, more would only queue"
    )
    two = [(ServerLoad(queued=1500), 0), (ServerLoad(queued=1500), 0)]
    assert next_ceiling(two, 3500, None, 5000, HEALTH)[0] == 2500, "queues add up across servers"


def test_the_servers_running_slots_and_a_short_queue_bound_the_ceiling() -> None:
    assert capacity([2]) == Capacity(2, 1) and capacity([64, 64]) == Capacity(128, 32)
    assert capacity([512, None]) is None, "one server's slots unknown: no bound"
    small = capacity([4])
    assert small is not None and small.most(HEALTH) == 5
    # A server that runs 4 at once, with 12 of the job's 16 queued: 5 in flight at most.
    ceiling, why = next_ceiling([(ServerLoad(running=4, queued=12), 0)], 16, None, 16, HEALTH, small)
    assert ceiling == 5 and "the servers run 4 at once: at most 5 in flight" in why
    # Before any scrape, or with its queue short (the default band would grow it): still 5.
    assert next_ceiling([], 0, None, 16, HEALTH, small)[0] == 5
    assert next_ceiling([(ServerLoad(running=4, queued=2), 0)], 5, 5, 16, HEALTH, small)[0] == 5, "steady"
    # The queue is never longer than healthy_queue_max, however many slots.
    narrow = Health(queue_min=2, queue_max=6, kv_usage_max=0.95)
    assert capacity([64]) is not None and Capacity(64, 16).most(narrow) == 70
    # Large servers: the band decides within the bound, and the bound above the operator's limit lifts it.
    large = capacity([1024, 1024])
    assert large is not None and large.most(HEALTH) == 2560
    deep = ServerLoad(running=2048, queued=3000, kv_usage=0.5)
    assert next_ceiling([(deep, 0)], 5048, None, 6000, HEALTH, large)[0] == 2560
    healthy = ServerLoad(running=2048, queued=300)
    assert next_ceiling([(healthy, 0)], 2348, 2348, 6000, HEALTH, large)[0] == 2348, "in the band: unchanged"
    assert next_ceiling([(healthy, 0)], 2348, None, 2400, HEALTH, large)[0] is None, (
        "above the operator's limit"
    )


def test_a_servers_slots_are_what_it_says_or_what_it_was_seen_running() -> None:
    said = {
        "max_running_requests": None,
        "dp_size": 1,
        "internal_states": [{"effective_max_running_requests_per_dp": 48}],
    }
    assert running_slots(said) == 48, "the scheduler's effective limit, the command line's flag unset"
    ranks = {"dp_size": 4, "internal_states": [{"effective_max_running_requests_per_dp": 32}] * 4}
    assert running_slots(ranks) == 128, "one entry per data-parallel rank"
    assert (
        running_slots({"dp_size": 4, "internal_states": [{"effective_max_running_requests_per_dp": 32}]})
        == 128
    )
    assert running_slots({"max_running_requests": 64}) == 64, "an older release: the flag"
    assert running_slots({}) is None
    worker = Worker("http://127.0.0.1:30000", ServerFacts(), gpus=8)
    assert worker.slots is None, "nothing said, nothing seen"
    worker.running_peak = 6
    assert worker.slots == 6
    worker.facts.running_slots = 4
    assert worker.slots == 6, "seen running more than it said"


def test_the_limit_obeys_the_lower_of_the_storm_and_the_backend() -> None:
    limit = AdaptiveLimit(100, minimum=8, adaptive=True, ceiling=100)
    limit.suggest(40)
    assert limit.current == 40 and limit.effective == 100
    for t in range(10):
        limit.on_throttle(float(t) * 2)
    assert limit.effective < 40 and limit.current == limit.effective
    limit.suggest(2)
    assert limit.current == 2, "the servers' ceiling is obeyed below the backoff's minimum"
    limit.suggest(None)
    assert limit.current == limit.effective


def test_failures_say_what_to_do() -> None:
    url = "http://127.0.0.1:30000"
    busy = errors.for_status(
        503, {"object": "error", "message": "Service Unavailable", "code": 503}, b"", url
    )
    assert busy.throttle and busy.disposition is Disposition.RETRY and busy.sent and not busy.outage
    bad = errors.for_status(400, {"error": {"message": "The input (9 tokens) is longer"}}, b"", url)
    assert bad.disposition is Disposition.GIVE_UP and bad.refused and "longer" in bad.message
    none_left = errors.for_status(503, {"error": {"message": "no_available_workers"}}, b"", url)
    assert none_left.outage and not none_left.sent
    assert errors.for_status(404, None, b"", url).disposition is Disposition.FATAL
    assert errors.for_status(401, {"error": "Unauthorized"}, b"", url).disposition is Disposition.FATAL
    assert errors.for_status(500, None, b"boom", url).disposition is Disposition.RETRY
    aborted = errors.for_abort({"type": "abort", "message": "Abort before prefill"}, url)
    assert aborted.disposition is Disposition.RETRY and aborted.error_class == "abort"
    refused = errors.for_abort({"type": "abort", "message": "too long", "status_code": 400}, url)
    assert refused.disposition is Disposition.GIVE_UP
    connect = errors.for_exception(
        aiohttp.ClientConnectorError(cast(ConnectionKey, _Key()), OSError(111, "refused")), url
    )
    assert connect.outage and not connect.sent
    cut = errors.for_exception(aiohttp.ServerDisconnectedError(), url)
    assert cut.sent and not cut.outage and cut.disposition is Disposition.RETRY


class _Key:
    """The connection key aiohttp's connector errors carry: the fields its message reads (the real
    NamedTuple's fields change between aiohttp releases)."""

    host, port, ssl, is_ssl = "127.0.0.1", 30000, None, False


@pytest.mark.parametrize("kind", ["kimi", "chatml"])
def test_render_ids_are_the_templates_ids(kind: str, tmp_path: Path) -> None:
    folder = build_tokenizer(tmp_path / kind, kind)
    for thinking in (True, False) if kind == "kimi" else (False,):
        tok = TargetTokenizer(TokenizerSpec(folder, template_kwargs={"thinking": thinking}))
        conversations = [
            [{"role": "user", "content": "What is 1+1?"}],
            [{"role": "user", "content": "Ünïcödé 東京 😀 <|im_end|> </think> inside the text"}],
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "   spaces\n\n\ttabs   "},
            ],
        ]
        for messages in conversations:
            assert tok.render_ids(messages) == tok.prompt_ids(messages)
    assert tok._render_fast is not None, "the fast path was the one tested"
