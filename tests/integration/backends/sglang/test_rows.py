"""SGLang rows: exactly the ids the server received and produced, the server's facts, GPU time."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import orjson
import pytest

from regen.engine.backends.base import AttemptOutcome
from regen.engine.backends.sglang.backend import SGLangBackend
from regen.engine.backends.sglang.wire import StreamTail
from regen.engine.backends.sglang.worker import Worker
from regen.engine.config.settings import Settings, TokenizerSettings
from regen.engine.data.datasets import Dataset
from regen.engine.data.tokenize_pool import TokenizePool
from regen.engine.data.tokenizer import TargetTokenizer, TokenizerSpec
from regen.engine.data.verify import verify_dataset
from regen.engine.job.job import Job, JobError, StopReason
from regen.sim.sglang.tokens import SimTokenizer
from tests.support.datasets import read_rows, write_dataset
from tests.support.recording_sim import SERVED, RecordingSim, recording_sim, sim_config
from tests.support.rows import unfilled_row
from tests.support.sglang_sim import model_folder
from tests.support.views import sglang_account

PROMPTS = [
    [{"role": "user", "content": f"question {i}: explain topic {i % 7} " + "é" * (i % 5)}] for i in range(40)
] + [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "And MoE?"},
    ]
]


async def run_job(settings: Settings) -> Job:
    job = Job(settings)
    await job.prepare()
    outcome = await job.run()
    assert outcome.reason is StopReason.DONE, outcome.message
    return job


async def test_rows_carry_exactly_the_servers_ids(
    sim: RecordingSim,
    sglang_settings: Callable[..., Settings],
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = write_dataset(tmp_path, "A", PROMPTS)

    def second_load(spec: TokenizerSpec) -> TargetTokenizer:
        raise AssertionError("the pool loaded a second copy of the backend's tokenizer in the job's process")

    # The pool names rows from the tokenizer the backend loaded (Backend.tokenizer): no copy of its own.
    monkeypatch.setattr("regen.engine.data.tokenize_pool.TargetTokenizer", second_load)
    started = time.monotonic()
    job = await run_job(sglang_settings([sim.base_url], [data]))
    wall = time.monotonic() - started
    rows = read_rows(data)
    assert len(rows) == len(PROMPTS)
    local = TargetTokenizer(TokenizerSpec(model_dir, template_kwargs={"thinking": True}))
    worker = f"127.0.0.1:{sim.port}"
    for row in rows:
        served = sim.served[row["generation_id"]]
        assert row["generation_id"] == f"{row['id']}#0"
        assert row["prompt_ids"] == served["prompt_ids"], "what was sent"
        assert row["prompt_ids"] == local.prompt_ids(PROMPTS[row["line"]]), "the template rendered here"
        # The simulator keeps the matched stop id, as SGLang does: nothing to append.
        assert row["output_ids"] == served["output_ids"]
        assert row["terminator_appended"] is False
        assert row["native_finish_reason"] == served["finish"]
        assert row["finish_reason"] == served["finish"]["type"]
        assert row["usage"]["completion_tokens"] == len(served["output_ids"])
        assert row["usage"]["prompt_tokens"] == len(served["prompt_ids"])
        assert (row["num_prompt_tokens"], row["num_output_tokens"]) == (
            len(row["prompt_ids"]),
            len(row["output_ids"]),
        )
        assert row["output_ids_source"] == "server"
        assert row["backend"] == "sglang" and row["provider"] == worker
        # The model is named by its served name, whatever the folder's path (docs/data-contract.md §3.2).
        assert row["model"] == SERVED and row["served_model"] == SERVED
        assert row["server"] == {
            "kind": "sglang",
            "version": "0.5.23",
            "served_model_name": SERVED,
            "weight_version": "default",
            "endpoint": "/generate",
        }
        assert row["request"]["max_tokens"] == 64 and row["request"]["thinking"] is True
        assert row["cost"] is None and row["gpu_s"] > 0
        assert row["tokenizer"] == local.info()
        text = (
            local.decode(row["output_ids"][:-1]) if row["status"] == "ok" else local.decode(row["output_ids"])
        )
        assert text.startswith(row["reasoning"]) and text.endswith(row["content"])
    assert {row["status"] for row in rows} <= {"ok", "truncated"}
    # Every row brought its ids: no batch went to a tokenizer worker, so none was ever started
    # (tests/engine/data/test_tokenizer.py: a pool started without workers starts one with its first batch).
    pool = job.lanes[0].settler.pool
    assert pool is not None and pool.rows_filled == len(rows) and pool.batches == 0
    report = verify_dataset(Dataset(data.name, data), local, check_prompts=True)
    assert not report.violations, dict(report.violations)
    # GPU time: every attempt's share adds up to the GPUs x the time the server was held.
    account = sglang_account(job.snapshot()["lanes"][0]["account"])
    spent = job.lanes[0].ledger.spent
    assert spent == sum(Decimal(str(row["gpu_s"])) for row in rows)
    assert float(spent) == pytest.approx(account["gpu_s"], abs=1e-3)
    assert 0 < float(spent) <= 8 * wall


async def test_instant_mode_renders_the_closed_think(
    sim: RecordingSim, sglang_settings: Callable[..., Settings], model_dir: Path, tmp_path: Path
) -> None:
    data = write_dataset(tmp_path, "I", 5)
    settings = sglang_settings([sim.base_url], [data])
    settings.tokenizer.thinking = False
    await run_job(settings)
    local = TargetTokenizer(TokenizerSpec(model_dir, template_kwargs={"thinking": False}))
    suffix = local.encode("<think></think>")
    for row in read_rows(data):
        assert row["prompt_ids"][-len(suffix) :] == suffix
        assert row["reasoning"] == "" and row["content"]
        assert row["request"]["thinking"] is False
        assert local.think_end_id not in row["output_ids"]


async def test_a_length_finish_is_a_truncated_row(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    async with recording_sim(sim_config(output_len_min=200, output_len_max=300), sim_tok) as server:
        data = write_dataset(tmp_path, "T", 4)
        await run_job(sglang_settings([server.base_url], [data]))
    for row in read_rows(data):
        assert row["status"] == "truncated" and row["finish_reason"] == "length"
        assert len(row["output_ids"]) == 64 and row["terminator_appended"] is False
        assert row["native_finish_reason"] == {"type": "length", "length": 64}


async def test_a_stop_without_its_id_gets_the_terminator(
    sim: RecordingSim, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """A server that trims the matched stop id from output_ids (docs/data-contract.md §5.2 leaves it
    to be confirmed): the backend appends it and says so."""
    backend = SGLangBackend(sglang_settings([sim.base_url], []))
    backend.tokenizer = TargetTokenizer(TokenizerSpec.from_settings(backend.all_settings.tokenizer))
    eot = backend.tokenizer.end_of_turn_id
    think_end = backend.tokenizer.think_end_id
    tail = StreamTail()
    chunk = {
        "text": "reasoning</think>answer",
        "output_ids": [5, 6, think_end, 7],
        "meta_info": {"finish_reason": {"type": "stop", "matched": eot}, "completion_tokens": 4},
    }
    tail.feed(b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n")
    outcome = AttemptOutcome()
    assert backend._read(outcome, tail, backend_worker(backend, sim), backend.tokenizer) is None
    assert outcome.output_ids == [5, 6, think_end, 7, eot] and outcome.terminator_appended
    assert (outcome.reasoning, outcome.content) == ("reasoning", "answer")
    assert outcome.usage["completion_tokens"] == 4


def backend_worker(backend: SGLangBackend, sim: RecordingSim) -> Worker:
    from regen.engine.backends.sglang.server import ServerFacts

    return Worker(sim.base_url, ServerFacts(), 8)


async def test_the_pool_keeps_what_the_backend_sent_and_got(model_dir: Path) -> None:
    spec = TokenizerSpec(model_dir, template_kwargs={"thinking": True})
    local = TargetTokenizer(spec)
    body = local.encode("why</think>because")
    sent = [1, 2, 3]  # not what a render would give: the pool must keep it, not re-render
    row = unfilled_row(
        0,
        "S",
        backend="sglang",
        prompt_ids=sent,
        output_ids=[*body, local.end_of_turn_id],
        output_ids_source="server",
        terminator_appended=True,
        reasoning="why",
        content="because",
    )
    async with TokenizePool(spec, workers=1) as pool:
        out = await pool.fill(row.copy(), [{"role": "user", "content": "x"}])
        assert pool.batches == 0, "no worker was asked"
    assert out["prompt_ids"] == sent and out["output_ids"] == row["output_ids"]
    assert out["terminator_appended"] is True and (out["reasoning"], out["content"]) == ("why", "because")
    assert (out["num_prompt_tokens"], out["num_output_tokens"]) == (3, len(body) + 1)
    assert out["tokenizer"] == local.info()


async def test_settings_that_cannot_work_are_refused(
    sim: RecordingSim, sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    data = write_dataset(tmp_path, "A", 3)
    wrong_name = sglang_settings([sim.base_url], [data], sglang={"served_model_name": "other-model"})
    with pytest.raises(
        JobError, match=re.escape("serves 'kimi-k2.5', not sglang.served_model_name = 'other-model'")
    ):
        await Job(wrong_name).prepare()
    nobody = sglang_settings(["http://127.0.0.1:9"], [data])
    with pytest.raises(JobError, match=re.escape("cannot reach http://127.0.0.1:9")):
        await Job(nobody).prepare()
    no_tokenizer = sglang_settings([sim.base_url], [data])
    no_tokenizer.tokenizer.path = None
    with pytest.raises(JobError, match=r"tokenizer\.path"):
        await Job(no_tokenizer).prepare()
    job = Job(sglang_settings([sim.base_url], [data]))
    await job.prepare()
    with pytest.raises(JobError, match="SGLang has no routes to exclude"):
        job.exclude(f"127.0.0.1:{sim.port}")
    assert job.snapshot()["lanes"][0]["supports_exclude"] is False
    assert (await job.run()).reason is StopReason.DONE


async def test_kimis_own_tokenizer_shape_renders_the_ids_sent_and_the_rows_verify(
    sglang_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """Kimi ships tiktoken.model and remote code, no tokenizer.json (docs/data-contract.md §8.1, §9):
    the prompt ids sent are apply_chat_template's, and the rows verify, on that shape too."""
    model = model_folder(tmp_path / "Kimi-K2.5", "tiktoken")
    served = SimTokenizer(model, trust_remote_code=True)
    async with recording_sim(sim_config(), served) as server:
        data = write_dataset(tmp_path, "K", PROMPTS)
        settings = sglang_settings([server.base_url], [data])
        settings.tokenizer = TokenizerSettings(path=model, workers=1, trust_remote_code=True)
        await run_job(settings)
    rows = read_rows(data)
    assert len(rows) == len(PROMPTS)
    hf = served.hf
    assert type(hf).__name__ == "TikTokenTokenizer"
    for row in rows:
        expected = hf.apply_chat_template(
            PROMPTS[row["line"]], tokenize=True, add_generation_prompt=True, thinking=True
        )
        assert row["prompt_ids"] == server.served[row["generation_id"]]["prompt_ids"] == list(expected)
        assert row["output_ids"] == server.served[row["generation_id"]]["output_ids"]
        assert set(row["tokenizer"]["files_sha256"]) == {
            "chat_template.jinja",
            "tiktoken.model",
            "tokenization_kimi.py",
            "tokenizer_config.json",
        }
    local = TargetTokenizer(TokenizerSpec.from_settings(settings.tokenizer))
    report = verify_dataset(Dataset(data.name, data), local, check_prompts=True)
    assert not report.violations, dict(report.violations)


async def test_a_prompt_past_the_served_context_is_given_up_before_it_is_sent(
    sim_tok: SimTokenizer, sglang_settings: Callable[..., Settings], model_dir: Path, tmp_path: Path
) -> None:
    """Its ids are rendered here, so its length is known: ids + max_tokens past the context the server
    serves (/v1/models' max_model_len) is given up as over_context, with its line, and never sent."""
    local = TargetTokenizer(TokenizerSpec(model_dir, template_kwargs={"thinking": True}))
    context = 160
    long = [{"role": "user", "content": "explain topic seven in depth " * 12}]
    prompts = [PROMPTS[i] if i % 3 else long for i in range(9)]
    over = {i for i, messages in enumerate(prompts) if len(local.prompt_ids(messages)) + 64 > context}
    assert over == {0, 3, 6}, "the long prompts, and only they, are past the context"
    async with recording_sim(sim_config(context_length=context), sim_tok) as server:
        data = write_dataset(tmp_path, "C", prompts)
        job = Job(sglang_settings([server.base_url], [data]))
        await job.prepare()
        outcome = await job.run()
        sent = set(server.served)
    assert outcome.reason is StopReason.FAILED_PROMPTS
    rows = read_rows(data)
    assert {row["line"] for row in rows} == set(range(9)) - over
    assert not any(rid.startswith(f"C-{line:08d}#") for rid in sent for line in over), "none was sent"
    records = [orjson.loads(x) for x in (tmp_path / "run" / "attempts.jsonl").read_bytes().splitlines()]
    gave_up = {r["line"]: r for r in records if r["k"] == "gave_up"}
    assert set(gave_up) == over
    for line, record in gave_up.items():
        n = len(local.prompt_ids(prompts[line]))
        assert record["ds"] == "C" and record["attempts"] == 1
        assert record["why"].startswith(f"over_context: {n} prompt tokens + max_tokens 64 = {n + 64} exceed")
        assert f"the {context} tokens of context" in record["why"]
    assert job.snapshot()["datasets"][0]["failed"] == len(over)
