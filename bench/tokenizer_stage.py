"""Tokenizer-stage benchmarks: TokenizePool throughput and ``regen verify`` speed.

    python bench/tokenizer_stage.py                       # pool vs single-process batch encode
    python bench/tokenizer_stage.py --verify-rows 100000  # also verify a generated dataset of that size
    python bench/tokenizer_stage.py --shapes json tiktoken  # the fast tokenizer and Kimi's own shape

Shapes (docs/data-contract.md §9): ``json`` is a tokenizer.json (a fast, Rust tokenizer); ``tiktoken``
is Kimi's shape, tiktoken.model with its remote-code class (tests/support/tiktoken_model.py), built on
the same learned vocabulary, so the two differ in how they encode and nothing else. For it the bench
also times the class's own path (transformers' slow path, which regen took before
engine/data/tiktoken_direct.py) beside the direct one, and the prompt render the SGLang backend does
on the job's loop for every request.

The tokenizer is a Kimi-shaped byte-level BPE trained here (no model can be downloaded); its
vocabulary is far smaller than Kimi's 163,840, so absolute rates differ from the real one, but the
pool's overhead relative to the tokenizer's own batch rate is what this measures.

Pool: ``fill`` is called for every row at once from an event loop, as the job does with thousands
of requests in flight; tokens/s counts prompt and output ids. Reference: the same fast tokenizer,
in this process, encoding the same texts (rendered prompts and output texts) with one batch call,
which already uses every core. The pool also renders each chat template (Python Jinja), which the
reference does not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from regen.engine.data.row import Row
from regen.engine.data.tokenize_pool import TokenizePool
from regen.engine.data.tokenizer import THINK_END, TargetTokenizer, TokenizerSpec
from tests.support.rows import unfilled_row
from tests.support.tiktoken_model import build_tiktoken_tokenizer, ranks_of_fast
from tests.support.tokenizers import build_tokenizer, corpus

DEMO = Path(__file__).resolve().parent.parent / "src" / "regen" / "demo" / "datasets"


def _words() -> list[str]:
    import json

    words: list[str] = []
    for path in sorted(DEMO.glob("*/prompts.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            for m in json.loads(line)["messages"]:
                words.extend(m["content"].split())
    return words or " ".join(corpus()).split()


def _text(rng: random.Random, words: list[str], n_words: int) -> str:
    out = []
    for i in range(n_words):
        out.append(words[rng.randrange(len(words))])
        if i % 17 == 16:
            out.append("\n\n" if i % 51 == 50 else "\n")
    return " ".join(out)


def make_cases(n: int, seed: int = 7) -> list[tuple[Row, list[dict[str, str]]]]:
    """Rows shaped like Kimi thinking answers: ~600-word reasoning, ~300-word content."""
    rng = random.Random(seed)
    words = _words()
    cases = []
    for i in range(n):
        messages = [{"role": "user", "content": _text(rng, words, rng.randint(20, 200))}]
        reasoning = _text(rng, words, rng.randint(200, 1000))
        row = unfilled_row(i, "BENCH", reasoning=reasoning, content=_text(rng, words, rng.randint(100, 500)))
        cases.append((row, messages))
    return cases


def build(folder: Path, vocab_size: int) -> Path:
    words = _words()
    rng = random.Random(1)
    texts = [_text(rng, words, 200) for _ in range(2000)] + corpus()
    return build_tokenizer(folder, "kimi", vocab_size=vocab_size, texts=texts)


def reference_rate(tok: TargetTokenizer, cases: list[tuple[Row, list[dict[str, str]]]]) -> float:
    """Tokens/s of one process encoding the rows' rendered prompts and output texts in one batch call
    (a fast tokenizer's call runs on every core; the tiktoken path encodes one text after another)."""
    texts = []
    for row, messages in cases:
        texts.append(tok.render(messages))
        texts.append(tok.output_text(row["reasoning"], row["content"], row["finish_reason"])[0])
    t0 = time.perf_counter()
    enc = tok.encode_batch(texts)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(ids) for ids in enc) + len(cases)  # + the appended end-of-turn ids
    return tokens / elapsed


def render_us(
    tok: TargetTokenizer, cases: list[tuple[Row, list[dict[str, str]]]], slow: bool = False
) -> float:
    """Microseconds per prompt of the SGLang backend's render on the loop (`render_ids`), or of
    apply_chat_template(tokenize=True) itself with `slow`."""
    prompts = [messages for _, messages in cases[:400]]
    call = tok.prompt_ids if slow else tok.render_ids
    t0 = time.perf_counter()
    for messages in prompts:
        call(messages)
    return (time.perf_counter() - t0) / len(prompts) * 1e6


async def pool_rate(
    spec: TokenizerSpec,
    cases: list[tuple[Row, list[dict[str, str]]]],
    workers: int,
    max_batch: int,
) -> tuple[float, float, int]:
    async with TokenizePool(spec, workers=workers, max_batch=max_batch) as pool:
        # Warm up (first calls import code paths in each worker).
        await asyncio.gather(*(pool.fill(r.copy(), m) for r, m in cases[: workers * 8]))
        batches = pool.batches
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(pool.fill(r.copy(), m) for r, m in cases))
        elapsed = time.perf_counter() - t0
        tokens = sum(r["num_prompt_tokens"] + r["num_output_tokens"] for r in rows)
        return tokens / elapsed, len(rows) / elapsed, pool.batches - batches


def bench_pool(args: argparse.Namespace, folder: Path, shape: str, baseline: dict[int, float]) -> None:
    """The pool's rates for one shape; `baseline` (the json shape's rows/s by worker count, filled by
    its run) is what the tiktoken shape's are divided by."""
    spec = TokenizerSpec(folder, trust_remote_code=shape == "tiktoken", template_kwargs={"thinking": True})
    tok = TargetTokenizer(spec)
    cases = make_cases(args.rows)
    ref = max(reference_rate(tok, cases) for _ in range(3))
    print(f"[{shape}] cpus {os.cpu_count()}, vocab {len(tok._tok)}, rows {len(cases)}")
    print(f"[{shape}] reference: one process, one batch call: {ref:,.0f} tokens/s")
    print(
        f"[{shape}] render_ids on the loop: {min(render_us(tok, cases) for _ in range(3)):,.0f} us a prompt"
    )
    if shape == "tiktoken":
        direct = tok._direct
        assert direct is not None, "the direct tiktoken path was not adopted"
        tok._direct = None  # the class's own path, as regen encoded before the direct one
        slow = reference_rate(tok, cases[: max(200, len(cases) // 10)])
        print(f"[{shape}] the class's own path, one process: {slow:,.0f} tokens/s (direct {ref / slow:.1f}x)")
        print(
            f"[{shape}] apply_chat_template(tokenize=True): {render_us(tok, cases, slow=True):,.0f} us a prompt"
        )
        tok._direct = direct
    counts = sorted({1, 2, os.cpu_count() or 1, *args.workers})
    for workers in counts:
        tps, rps, batches = asyncio.run(pool_rate(spec, cases, workers, args.max_batch))
        against = f", {rps / baseline[workers]:.2f} of the json shape's rows/s" if workers in baseline else ""
        if shape == "json":
            baseline[workers] = rps
        print(
            f"[{shape}] pool: {workers} worker(s), max_batch {args.max_batch}: {tps:,.0f} tokens/s, "
            f"{rps:,.0f} rows/s, {batches} batches ({len(cases) / max(1, batches):.0f} rows each), "
            f"ratio to the batch rate {tps / ref:.2f}{against}"
        )


def bench_verify(args: argparse.Namespace, folder: Path, work: Path) -> None:
    import orjson

    from regen.engine.data.datasets import Dataset, canonical_sha256
    from regen.engine.data.verify import verify_dataset

    spec = TokenizerSpec(folder, template_kwargs={"thinking": True})
    tok = TargetTokenizer(spec)
    n = args.verify_rows
    ds_dir = work / "V1"
    ds_dir.mkdir()
    rng = random.Random(3)
    words = _words()
    t0 = time.perf_counter()
    info = tok.info()
    with (
        open(ds_dir / "prompts.jsonl", "wb") as prompts,
        open(ds_dir / "raw_responses.jsonl", "wb") as results,
    ):
        chunk = 2000
        for start in range(0, n, chunk):
            batch = []
            for line in range(start, min(n, start + chunk)):
                messages = [{"role": "user", "content": _text(rng, words, rng.randint(10, 60))}]
                reasoning = _text(rng, words, rng.randint(40, 200))
                content = _text(rng, words, rng.randint(20, 100))
                batch.append((line, messages, reasoning, content))
            texts = []
            for _, messages, reasoning, content in batch:
                texts.append(tok.render(messages))
                texts.append(reasoning + THINK_END + content)
            enc = tok.encode_batch(texts)
            for k, (line, messages, reasoning, content) in enumerate(batch):
                prompts.write(orjson.dumps({"messages": messages}) + b"\n")
                prompt_ids, out = enc[2 * k], [*enc[2 * k + 1], tok.end_of_turn_id]
                row = {
                    "schema_version": 1,
                    "id": f"V1-{line:08d}",
                    "dataset": "V1",
                    "line": line,
                    "prompt_sha256": canonical_sha256(messages),
                    "status": "ok",
                    "backend": "openrouter",
                    "finish_reason": "stop",
                    "reasoning": reasoning,
                    "content": content,
                    "prompt_ids": prompt_ids,
                    "output_ids": out,
                    "output_ids_source": "retokenized",
                    "terminator_appended": True,
                    "num_prompt_tokens": len(prompt_ids),
                    "num_output_tokens": len(out),
                    "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(out)},
                    "cost": 0.001,
                    "request": {"thinking": True},
                    "tokenizer": info,
                }
                results.write(orjson.dumps(row) + b"\n")
    size = (ds_dir / "raw_responses.jsonl").stat().st_size
    print(f"verify: generated {n:,} rows ({size / 1e6:,.0f} MB) in {time.perf_counter() - t0:.1f}s")
    ds = Dataset("V1", ds_dir)
    for label, kwargs in (
        ("structure only (no tokenizer)", {"tokenizer": None}),
        ("with tokenizer (decode checks)", {"tokenizer": tok}),
        ("with tokenizer and --check-prompts", {"tokenizer": tok, "check_prompts": True}),
    ):
        t0 = time.perf_counter()
        report = verify_dataset(ds, **kwargs)
        elapsed = time.perf_counter() - t0
        assert not report.violations, report.examples
        print(
            f"verify {label}: {n / elapsed:,.0f} rows/s, "
            f"{(report.prompt_tokens + report.output_tokens) / elapsed / 1e6:,.1f} M ids/s ({elapsed:.1f}s)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000, help="rows for the pool benchmark")
    parser.add_argument("--workers", type=int, nargs="*", default=[], help="extra worker counts to try")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=8000, help="BPE vocabulary size to train")
    parser.add_argument("--verify-rows", type=int, default=0, help="also benchmark verify on this many rows")
    parser.add_argument("--skip-pool", action="store_true")
    parser.add_argument("--shapes", nargs="+", choices=["json", "tiktoken"], default=["json"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="regen-bench-") as tmp:
        work = Path(tmp)
        folder = build(work / "tok", args.vocab)
        folders = {"json": folder}
        if "tiktoken" in args.shapes:
            # The same learned vocabulary in Kimi's shape: only how it is encoded differs.
            ranks = ranks_of_fast(folder / "tokenizer.json")
            folders["tiktoken"] = build_tiktoken_tokenizer(work / "tok-tiktoken", ranks=ranks)
        baseline: dict[int, float] = {}
        if not args.skip_pool:
            for shape in ("json", "tiktoken"):
                if shape in args.shapes or (shape == "json" and "tiktoken" in args.shapes):
                    bench_pool(args, folders[shape], shape, baseline)
        if args.verify_rows:
            bench_verify(args, folder, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
