"""What regen needs of an SGLang server's HTTP, whoever launched it (docs/sglang.md §1, §3, §4).

Here, below the settings, the host layer and the backend, because each of them applies one of these
rules: the settings refuse launch flags that change what regen reads, the host and the backend check a
running server's `/server_info` for the same, and every client pool keeps idle connections for less
time than the server does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "KEEPALIVE_S",
    "LAUNCH_STREAM_INTERVAL",
    "MAX_STREAM_INTERVAL",
    "STREAM_CHUNKS",
    "launch_arg_problem",
    "stream_interval",
    "streaming_problem",
]

# uvicorn in SGLang closes a keep-alive connection idle for SGLANG_TIMEOUT_KEEP_ALIVE (5 s). A client
# that keeps one longer may send on it just as the server closes it: the request then fails as a
# dropped connection. Idle connections are closed here first.
KEEPALIVE_S = 3.0

# SGLang streams cumulatively: each chunk repeats the answer so far. A chunk per id (the server's
# default --stream-interval 1) makes a stream's bytes grow with the square of the answer's length
# (an 8k-token answer is ~370 MB over its life). A request asks for a chunk every
# `stream_interval(max_new_tokens)` ids instead: a full-length answer then comes in about
# STREAM_CHUNKS chunks, so its stream is about (STREAM_CHUNKS + 1) / 2 times the answer's own bytes
# however long answers grow (docs/sglang.md §4, "Streaming").
STREAM_CHUNKS = 32
# The most ids between two chunks: a chunk is also the stream's sign of life (the idle limit,
# sglang.read_timeout_s, counts from the last one), so it must come every minute or so even at
# 15 tokens/s a request.
MAX_STREAM_INTERVAL = 1024
# The router (smg 1.13.0) drops sampling_params.stream_interval when it re-serialises a body, so a
# request through it gets the server's --stream-interval: regen launches its servers with this one.
LAUNCH_STREAM_INTERVAL = 256


def stream_interval(max_new_tokens: int) -> int:
    """Ids between two chunks of one answer's stream, from the longest it may be."""
    return max(1, min(MAX_STREAM_INTERVAL, math.ceil(max_new_tokens / STREAM_CHUNKS)))


# Launch flags with which each chunk of a stream holds only what is new (0.5.23, and its 0.5.9
# name) and the /server_info key each is reported under. regen reads every chunk as the whole
# answer so far, so a row would hold the last piece only, and still look finished.
INCREMENTAL_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--incremental-streaming-output", "incremental_streaming_output", "0.5.23"),
    ("--stream-output", "stream_output", "0.5.9"),
)
# --log-level values that hide the INFO lines regen follows a start by (the phases, "ready").
QUIET_LEVELS = ("warning", "error", "critical")


def launch_arg_problem(args: Sequence[str]) -> str | None:
    """Why `sglang.launch_args` cannot be used, naming the word; None when they can. A flag is
    matched as argparse matches it: exactly, or by a prefix of it (docs/sglang.md §1)."""
    for i, word in enumerate(args):
        name, _, inline = word.partition("=")
        if not name.startswith("--") or len(name) <= 2:
            continue
        for flag, _key, release in INCREMENTAL_FLAGS:
            if flag.startswith(name):
                return (
                    f"{word!r}: with {flag} (sglang {release}) each chunk of the stream holds only what is "
                    "new, and regen reads every chunk as the whole answer so far: leave it out"
                )
        if name == "--log-level":
            value = inline if inline else (args[i + 1] if i + 1 < len(args) else "")
            if value.lower() in QUIET_LEVELS:
                return (
                    f"'--log-level {value}': regen follows a start by the server's INFO lines (its phases "
                    "and the ready line), which this level hides; use --log-level-http to quieten uvicorn"
                )
    return None


def streaming_problem(server_info: Mapping[str, Any]) -> str | None:
    """Why a running server's stream cannot be read by regen, from its `/server_info`; None if it can."""
    for flag, key, _release in INCREMENTAL_FLAGS:
        if server_info.get(key) is True:
            return (
                f"it runs with {flag} ({key}: true in /server_info): each chunk of its stream holds only "
                f"what is new, and regen reads every chunk as the whole answer so far; restart it without {flag}"
            )
    return None
