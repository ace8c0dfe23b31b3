"""Token ids for finished rows, computed in worker processes beside the job's asyncio loop.

Rendering a chat template and encoding thousands of tokens takes milliseconds of CPU per row; done
on the job's loop it would stall every stream in flight. ``TokenizePool`` hands rows to a
``ProcessPoolExecutor`` whose workers each load the tokenizer once. Rows that arrive close together
(within ``max_delay_s``, up to ``max_batch``) travel as one call, so the per-call cost of pickling
and process hand-off is paid once per batch, and a fast tokenizer encodes the whole batch in one
native call. While every worker is busy, rows gather into bigger batches instead of queueing one
call each, so the pool's throughput rises with the load.

Use::

    pool = TokenizePool(TokenizerSpec.from_settings(settings.tokenizer), workers=settings.tokenizer.workers)
    await pool.start()             # loads the tokenizer in every worker; TokenizerError if it cannot
    row = await pool.fill(row, prompt.messages)
    await pool.close()

Workers are started with ``spawn`` (the job has threads that ``fork`` would copy mid-flight), so,
as with any spawn pool, a script that starts one must keep its top level behind
``if __name__ == "__main__":``; the ``regen`` entry point does.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from array import array
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Final, NamedTuple

from regen.engine.data.row import OutputIdsSource, Row, TokenizerBlock
from regen.engine.data.tokenizer import TargetTokenizer, TokenizeError, TokenizerError, TokenizerSpec
from regen.engine.lifetime import die_with_parent

__all__ = ["TokenizePool", "fill_batch"]

# Token ids fit in 32 bits; an array of them pickles as one memcpy instead of an object per id.
_ID_TYPE = "I"

# ---------------------------------------------------------------------------------------------
# Worker side (module level so the spawned processes can import it)

_worker: TargetTokenizer | None = None
_worker_error: str | None = None


def _init_worker(spec: TokenizerSpec, threads: int | None, parent: int) -> None:
    global _worker, _worker_error
    # A worker ends with the job, even one killed by SIGKILL (engine/lifetime.py).
    die_with_parent(parent)
    if threads is not None:
        # Every worker is already one of several processes; letting each one's native encoder
        # also spread over all cores only makes them fight for the same CPUs.
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    try:
        _worker = TargetTokenizer(spec)
    except TokenizerError as exc:
        # Raising here would break the whole pool with an anonymous error; keep the message for
        # the first call to report instead.
        _worker_error = str(exc)
    except Exception as exc:
        _worker_error = f"{spec.path}: cannot load the tokenizer: {type(exc).__name__}: {exc}"


def _hello() -> tuple[int, str | None, TokenizerBlock | None]:
    if _worker is None:
        return os.getpid(), _worker_error or "tokenizer not loaded", None
    return os.getpid(), None, _worker.info()


def _ids(values: Sequence[int]) -> bytes:
    return array(_ID_TYPE, values).tobytes()


def _unids(data: bytes) -> list[int]:
    a = array(_ID_TYPE)
    a.frombytes(data)
    return a.tolist()


# What a row's `output_ids_source` says its output ids are (docs/data-contract.md §5.2, §5.3).
SERVER: Final = "server"  # the backend sent the server's own ids: kept, terminated, decoded into the text
RETOKENIZED: Final = "retokenized"  # the backend sent text: encoded here into the ids


class RowWork(NamedTuple):
    """One row's work for a worker (a NamedTuple pickles as a plain tuple does, with its fields named)."""

    output_ids_source: OutputIdsSource  # SERVER or RETOKENIZED: which of the fields below the worker reads
    messages: list[dict[str, Any]]  # the prompt, rendered into the prompt ids
    finish_reason: Any  # as the row has it: the tokenizer refuses all but "stop" and "length"
    server_ids: bytes  # SERVER: the server's output ids, packed (`_ids`); b"" otherwise
    reasoning: str  # RETOKENIZED: the row's text; "" otherwise
    content: str


class RowIds(NamedTuple):
    """A worker's answer for one row: its ids packed, or why it has none."""

    error: str | None  # None: tokenized
    prompt_ids: bytes
    output_ids: bytes
    terminator_appended: bool
    reasoning: str | None  # SERVER: the text the ids decode to, split; None otherwise
    content: str | None


def _failed(message: str) -> RowIds:
    return RowIds(message, b"", b"", False, None, None)


def _encode_all(encode_batch: Any, encode_one: Any, texts: list[str]) -> list[list[int] | Exception]:
    """`texts` encoded in one call; where that fails, each on its own, so one bad text fails alone."""
    try:
        return list(encode_batch(texts))
    except Exception:
        encoded: list[list[int] | Exception] = []
        for text in texts:
            try:
                encoded.append(encode_one(text))
            except Exception as exc:
                encoded.append(exc)
        return encoded


def fill_batch(tok: TargetTokenizer, jobs: Sequence[RowWork]) -> list[RowIds]:
    """Token ids for a batch of rows: one encode call for all their prompts and one for all their
    output texts (encoded as text, docs/data-contract.md §5.3: `TargetTokenizer.retokenize`)."""
    results: list[RowIds | None] = [None] * len(jobs)
    prompts: list[str] = []
    parts: list[str] = []
    # (job index, prompt index, first part index, parts (0: the server's ids), output ids, appended,
    #  reasoning, content)
    plan: list[tuple[int, int, int, int, list[int] | None, bool, str | None, str | None]] = []
    server_bodies: list[tuple[int, list[int], bool]] = []
    for i, job in enumerate(jobs):
        try:
            prompt_text = tok.render(job.messages)
            if job.output_ids_source == SERVER:
                server_ids = _unids(job.server_ids)
                appended = tok.terminate(server_ids, job.finish_reason)
                body = server_ids[:-1] if job.finish_reason == "stop" else server_ids
                server_bodies.append((len(plan), body, appended))
                prompts.append(prompt_text)
                plan.append((i, len(prompts) - 1, 0, 0, server_ids, appended, None, None))
            else:
                texts, append = tok.output_parts(job.reasoning, job.content, job.finish_reason)
                prompts.append(prompt_text)
                plan.append((i, len(prompts) - 1, len(parts), len(texts), None, append, None, None))
                parts.extend(texts)
        except Exception as exc:
            results[i] = _failed(f"{type(exc).__name__}: {exc}")

    if server_bodies:
        decoded = tok.decode_batch([body for _, body, _ in server_bodies])
        for (p, _, _), text in zip(server_bodies, decoded, strict=True):
            split_reasoning, split_content = tok.split_text(text)
            i, pt, first, count, kept, appended, _, _ = plan[p]
            plan[p] = (i, pt, first, count, kept, appended, split_reasoning, split_content)

    encoded = _encode_all(tok.encode_batch, tok.encode, prompts)
    encoded_parts = _encode_all(tok.encode_text_batch, tok.encode_text, parts)

    for i, pt, first, count, ids, appended, reasoning, content in plan:
        prompt_ids = encoded[pt]
        pieces = encoded_parts[first : first + count]
        bad = next((e for e in (prompt_ids, *pieces) if isinstance(e, Exception)), None)
        if bad is not None:
            results[i] = _failed(f"{type(bad).__name__}: {bad}")
            continue
        assert not isinstance(prompt_ids, Exception)
        out = (
            ids
            if count == 0
            else tok.join_parts([p for p in pieces if not isinstance(p, Exception)], appended)
        )
        assert out is not None
        results[i] = RowIds(None, _ids(prompt_ids), _ids(out), appended, reasoning, content)
    return [r if r is not None else _failed("not tokenized") for r in results]


def _fill(jobs: list[RowWork]) -> list[RowIds]:
    if _worker is None:
        raise TokenizerError(_worker_error or "tokenizer not loaded")
    return fill_batch(_worker, jobs)


# ---------------------------------------------------------------------------------------------
# The job's side


class TokenizePool:
    """Fills rows' token ids in ``workers`` processes without blocking the event loop."""

    def __init__(
        self,
        spec: TokenizerSpec,
        workers: int = 2,
        *,
        max_batch: int = 64,
        max_delay_s: float = 0.005,
        threads_per_worker: int | None = 1,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.spec = spec
        self.workers = workers
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.threads_per_worker = threads_per_worker
        # Two batches per worker keep each one busy while the next is pickled and sent.
        self._max_in_flight = 2 * workers
        self._executor: ProcessPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[RowWork, asyncio.Future[RowIds]]] = []
        self._in_flight: set[asyncio.Future[list[RowIds]]] = set()
        self._rows_in_flight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._info: TokenizerBlock | None = None
        self.rows_filled = 0
        self.batches = 0

    @property
    def info(self) -> TokenizerBlock:
        """The ``tokenizer`` block every filled row gets (after ``start``)."""
        if self._info is None:
            raise TokenizeError("tokenize pool not started")
        return self._info

    @property
    def thinking(self) -> bool:
        """The template's thinking switch the rows are rendered with."""
        return bool(self.info["template_kwargs"].get("thinking", False))

    @property
    def pending(self) -> int:
        """Rows waiting for a worker or being tokenized; for the job's snapshot."""
        return len(self._pending) + self._rows_in_flight

    async def start(self, loaded: TargetTokenizer | None = None) -> None:
        """Start the workers and load the tokenizer in each; raises ``TokenizerError`` if it fails.

        ``loaded``: the same tokenizer, already loaded in this process (a backend that renders its
        own ids, engine/backends/base.py ``Backend.tokenizer``). The pool then takes its ``info``
        from it, and the workers start with the first row that needs one: a job whose rows all
        bring their ids never pays their start, a process and the tokenizer's load each (seconds of
        CPU and ~150 MB apiece for a large vocabulary), nor a second load in its own process."""
        if self._executor is not None:
            return
        if loaded is not None and loaded.spec != self.spec:
            raise ValueError(f"the loaded tokenizer is {loaded.spec}, the pool's {self.spec}")
        self._loop = asyncio.get_running_loop()
        # spawn, not fork: the job process has threads (writers, executors) that fork would copy
        # in whatever state they are in. The executor starts a process at a submit, not before.
        self._executor = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(self.spec, self.threads_per_worker, os.getpid()),
        )
        if loaded is not None:
            self._info = loaded.info()
            return
        try:
            # One greeting per worker: the executor starts a process for each call it cannot give
            # to an idle one, so these start all of them and surface a load failure now.
            hellos = await asyncio.gather(
                *(self._loop.run_in_executor(self._executor, _hello) for _ in range(self.workers))
            )
        except BrokenProcessPool as exc:
            await self._shutdown()
            raise TokenizerError(f"{self.spec.path}: tokenizer worker died while loading: {exc}") from None
        errors = [err for _, err, _ in hellos if err]
        if errors:
            await self._shutdown()
            raise TokenizerError(errors[0])
        self._info = hellos[0][2]

    async def fill(self, row: Row, messages: Sequence[Mapping[str, Any]]) -> Row:
        """Set the row's ids, counts, ``output_ids_source``, ``terminator_appended`` and tokenizer block.

        A row whose ``output_ids_source`` is "server" keeps the server's ``output_ids`` (terminated
        per docs/data-contract.md §5.2) and gets ``reasoning`` and ``content`` from them; any other
        is retokenized from its ``reasoning``/``content`` (§5.3). The prompt is rendered from
        ``messages``. A server row that already holds its prompt ids (the SGLang backend sends ids
        and splits the server's text itself) only gets its tokenizer block. Returns ``row``.
        """
        if self._closed or self._executor is None or self._loop is None:
            raise TokenizeError("tokenize pool is not running")
        server = row["output_ids_source"] == SERVER
        finish = row["finish_reason"]
        asked = row["request"].get("thinking")
        if isinstance(asked, bool) and asked != self.thinking:
            # The prompt would be rendered for one mode while the model answered in the other.
            raise TokenizeError(
                f"{row['id']}: the request had thinking={asked} but the tokenizer's template "
                f"renders thinking={self.thinking}; make tokenizer.thinking match the backend"
            )
        if server and row["prompt_ids"]:
            # The backend sent these prompt ids, kept the server's output ids (terminated per
            # docs/data-contract.md §5.2) and split the server's text: nothing is re-rendered or
            # re-encoded, so there is nothing for a worker to do.
            row["num_prompt_tokens"] = len(row["prompt_ids"])
            row["num_output_tokens"] = len(row["output_ids"])
            row["tokenizer"] = self.info.copy()
            self.rows_filled += 1
            return row
        msgs = [dict(m) for m in messages]
        if server:
            job = RowWork(SERVER, msgs, finish, _ids(row["output_ids"]), "", "")
        else:
            job = RowWork(RETOKENIZED, msgs, finish, b"", row["reasoning"], row["content"])
        fut: asyncio.Future[RowIds] = self._loop.create_future()
        self._pending.append((job, fut))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = self._loop.call_later(self.max_delay_s, self._on_timer)
        done = await fut
        if done.error is not None:
            raise TokenizeError(f"{row['id']}: cannot tokenize: {done.error}")
        prompt_ids = _unids(done.prompt_ids)
        output_ids = _unids(done.output_ids)
        row["prompt_ids"] = prompt_ids
        row["output_ids"] = output_ids
        row["output_ids_source"] = job.output_ids_source
        row["terminator_appended"] = done.terminator_appended
        row["num_prompt_tokens"] = len(prompt_ids)
        row["num_output_tokens"] = len(output_ids)
        if server:
            assert done.reasoning is not None and done.content is not None
            row["reasoning"] = done.reasoning
            row["content"] = done.content
        row["tokenizer"] = self.info.copy()
        self.rows_filled += 1
        return row

    def _on_timer(self) -> None:
        self._timer = None
        self._flush()

    def _flush(self, force: bool = False) -> None:
        assert self._executor is not None and self._loop is not None
        while self._pending and (force or len(self._in_flight) < self._max_in_flight):
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            jobs = [job for job, _ in batch]
            try:
                cf = self._executor.submit(_fill, jobs)
            except (BrokenProcessPool, RuntimeError) as exc:
                self._fail(batch, TokenizeError(f"tokenizer workers unavailable: {exc}"))
                continue
            afut = asyncio.wrap_future(cf, loop=self._loop)
            self._in_flight.add(afut)
            self._rows_in_flight += len(batch)
            self.batches += 1
            afut.add_done_callback(lambda f, batch=batch: self._done(batch, f))  # type: ignore[misc]
        if self._pending and self._timer is None and len(self._in_flight) < self._max_in_flight:
            self._timer = self._loop.call_later(self.max_delay_s, self._on_timer)

    def _done(
        self, batch: list[tuple[RowWork, asyncio.Future[RowIds]]], afut: asyncio.Future[list[RowIds]]
    ) -> None:
        self._in_flight.discard(afut)
        self._rows_in_flight -= len(batch)
        if afut.cancelled():
            self._fail(batch, TokenizeError("tokenizing was cancelled"))
        elif (exc := afut.exception()) is not None:
            if isinstance(exc, BrokenProcessPool):
                exc = TokenizeError(f"a tokenizer worker died: {exc}")
            elif not isinstance(exc, TokenizeError | TokenizerError):
                exc = TokenizeError(f"{type(exc).__name__}: {exc}")
            self._fail(batch, exc)
        else:
            for (_, fut), result in zip(batch, afut.result(), strict=True):
                if not fut.done():
                    fut.set_result(result)
        # A worker just freed up: rows that gathered meanwhile go now, as one batch.
        if self._pending and not self._closed:
            self._flush()

    @staticmethod
    def _fail(batch: list[tuple[RowWork, asyncio.Future[RowIds]]], exc: BaseException) -> None:
        for _, fut in batch:
            if not fut.done():
                fut.set_exception(exc)

    async def close(self) -> None:
        """Finish the rows already handed in, then stop the workers."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._executor is not None and self._pending:
            self._flush(force=True)
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
        await self._shutdown()

    async def _shutdown(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            # shutdown(wait=True) joins processes; off the loop so streams keep flowing meanwhile.
            await asyncio.to_thread(executor.shutdown, True, cancel_futures=True)

    async def __aenter__(self) -> TokenizePool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
