"""Write the bundled demo datasets: ``demo/datasets/{chat,code,reasoning}/prompts.jsonl``.

``regen demo`` runs on these, so they are written by us (nothing downloaded) and deterministic:
hand-written lists of topics, tasks and phrasings are combined by index, with no randomness.
Re-running this script reproduces the committed files byte for byte (a test checks it).

What the sample exercises, on purpose:
- single-turn prompts, prompts with a leading system message, and multi-turn prompts
  (user / assistant / user);
- an optional source ``id`` on some lines and a ``meta`` object on some code prompts;
- non-ASCII text (German, Japanese, French, an emoji) in a few prompts;
- one deliberately duplicated prompt: ``chat`` lines 100 and 101 are byte-identical, because
  duplicate prompts must stay two distinct rows (docs/data-contract.md §2).

Usage: ``python -m regen.demo.make_datasets [OUT_DIR]`` (default: the bundled folder).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parent / "datasets"

Message = dict[str, str]
Line = dict[str, Any]


def _user(text: str) -> Message:
    return {"role": "user", "content": text}


def _line(
    messages: list[Message],
    *,
    id: str | None = None,
    meta: dict[str, Any] | None = None,
    system: str | None = None,
) -> Line:
    msgs = ([{"role": "system", "content": system}] if system else []) + messages
    line: Line = {}
    if id is not None:
        line["id"] = id
    line["messages"] = msgs
    if meta is not None:
        line["meta"] = meta
    return line


# ---------------------------------------------------------------------------------------------
# chat: 20 topics x 10 phrasings = 200 prompts, plus a few hand-written ones folded in.

CHAT_TOPICS = [
    "how mixture-of-experts layers route tokens",
    "why the sky is blue",
    "how vaccines train the immune system",
    "the causes of the 2008 financial crisis",
    "how a refrigerator moves heat",
    "what a Fourier transform does",
    "how bees communicate where flowers are",
    "the difference between weather and climate",
    "how public-key cryptography works",
    "why sourdough bread rises",
    "how GPS receivers find their position",
    "what inflation is and why central banks care",
    "how noise-cancelling headphones work",
    "the main ideas of stoic philosophy",
    "how plate tectonics shapes continents",
    "why we dream",
    "how a compiler turns source code into machine code",
    "what makes a good night's sleep",
    "how solar panels turn light into electricity",
    "how speculative decoding speeds up language models",
]

CHAT_PHRASINGS = [
    "Explain {t} in two sentences.",
    "Can you explain {t} to a ten-year-old?",
    "Write a short paragraph on {t} for a science newsletter.",
    "What are the three most common misconceptions about {t}?",
    "Give me a one-line summary of {t}, then a longer explanation.",
    "I'm preparing a talk. Outline five slides on {t}.",
    "Explain {t} using an everyday analogy.",
    "What would an expert want a beginner to understand first about {t}?",
    "Write a limerick about {t}.",
    "Compare two different ways people explain {t}, and say which is clearer.",
]

CHAT_SYSTEMS = [
    "You are a concise assistant. Answer in plain language.",
    "You are a patient teacher who checks understanding with a question at the end.",
    "You are a science journalist writing for a general audience.",
]

# Hand-written prompts in other languages; they replace generated lines at fixed positions.
CHAT_FOREIGN = {
    17: _line(
        [
            _user(
                "Erkläre bitte in drei Sätzen, wie eine Wärmepumpe funktioniert "
                "und warum sie im Winter effizienter ist als eine Elektroheizung."
            )
        ],
        id="de-001",
    ),
    53: _line([_user("機械学習における過学習とは何ですか？簡単な例を挙げて説明してください。")], id="ja-001"),
    88: _line(
        [
            _user(
                "Quelle est la différence entre un virus et une bactérie ? "
                "Réponds en français, en un paragraphe."
            )
        ]
    ),
    131: _line(
        [_user("東京から大阪まで新幹線で移動する場合、所要時間と料金の目安を教えてください。")],
        system="あなたは丁寧な旅行アドバイザーです。日本語で答えてください。",
    ),
    164: _line([_user("Schreib mir ein kurzes Gedicht über den Herbst im Schwarzwald 🍂.")], id="de-002"),
}

# Multi-turn conversations; each replaces a generated line at its position.
CHAT_MULTI = {
    29: [
        _user("What's a good name for a grey cat?"),
        {"role": "assistant", "content": "How about Ash, Smokey, or Earl Grey?"},
        _user("Earl Grey is great. Give me three more tea-themed names."),
    ],
    76: [
        _user("Summarise the plot of Hamlet in one sentence."),
        {
            "role": "assistant",
            "content": "A Danish prince feigns madness to avenge his father's "
            "murder by his uncle, and nearly everyone dies.",
        },
        _user("Now do the same for Macbeth."),
    ],
    143: [
        _user("I want to start running. Where do I begin?"),
        {
            "role": "assistant",
            "content": "Start with run-walk intervals three times a week: one "
            "minute running, two minutes walking, for twenty minutes.",
        },
        _user("My knees hurt after the second week. What should I change?"),
    ],
    187: [
        _user("Translate 'good morning' into Spanish."),
        {"role": "assistant", "content": "Buenos días."},
        _user("And into Japanese and German?"),
    ],
}

# chat lines 100 and 101: the same prompt twice, byte for byte.
CHAT_DUPLICATE_AT = 100


def build_chat() -> list[Line]:
    lines: list[Line] = []
    for i in range(200):
        topic = CHAT_TOPICS[i % len(CHAT_TOPICS)]
        phrasing = CHAT_PHRASINGS[(i // len(CHAT_TOPICS)) % len(CHAT_PHRASINGS)]
        system = CHAT_SYSTEMS[(i // 5) % len(CHAT_SYSTEMS)] if i % 5 == 0 else None
        line_id = f"chat-src-{i:04d}" if i % 7 == 3 else None
        if i in CHAT_FOREIGN:
            lines.append(CHAT_FOREIGN[i])
        elif i in CHAT_MULTI:
            lines.append(_line(CHAT_MULTI[i], system=system))
        elif i == CHAT_DUPLICATE_AT + 1:
            lines.append(lines[CHAT_DUPLICATE_AT])
        else:
            lines.append(_line([_user(phrasing.format(t=topic))], id=line_id, system=system))
    return lines


# ---------------------------------------------------------------------------------------------
# code: 6 languages x 20 tasks = 120 prompts.

CODE_LANGUAGES = ["Python", "Rust", "Go", "TypeScript", "C", "SQL"]

CODE_TASKS = [
    "Write a function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Implement binary search over a sorted array and explain its edge cases.",
    "Write a function that merges two sorted lists into one sorted list.",
    "Parse a CSV line that may contain quoted fields with commas inside them.",
    "Implement an LRU cache with get and put in O(1).",
    "Write code that counts word frequencies in a text and prints the top 10.",
    "Implement a token-bucket rate limiter.",
    "Write a function that flattens an arbitrarily nested list.",
    "Implement Dijkstra's shortest path algorithm on an adjacency list.",
    "Write a retry helper with exponential backoff and jitter.",
    "Validate an IPv4 address without using regular expressions.",
    "Implement a trie with insert, search and prefix search.",
    "Write a function that converts a Roman numeral to an integer.",
    "Detect a cycle in a linked list and return where it starts.",
    "Implement a thread-safe counter and show how to test it.",
    "Write a function that returns all permutations of a string without duplicates.",
    "Compute the edit distance between two strings.",
    "Stream a large file line by line and report the longest line.",
    "Implement run-length encoding and decoding.",
    "Write a function that groups anagrams from a list of words.",
]

# SQL gets its own tasks: most of the general ones make no sense as a query.
SQL_TASKS = [
    "Write a query that returns the second-highest salary per department.",
    "Find customers who placed an order in every month of 2025.",
    "Compute a 7-day rolling average of daily sales.",
    "Delete duplicate rows from a table, keeping the row with the smallest id.",
    "List employees together with their manager's name using a self-join.",
    "Find gaps in a sequence of invoice numbers.",
    "Pivot monthly revenue per product into one column per month.",
    "Return the top 3 products by revenue in each category.",
    "Count sessions per user, where a session ends after 30 minutes of inactivity.",
    "Find users whose first and last purchase were on the same day.",
    "Compute the median order value without a MEDIAN function.",
    "Return every pair of products that were bought together at least 10 times.",
    "Write a recursive query that lists all reports under a manager.",
    "Find the longest streak of consecutive login days per user.",
    "Return orders whose total differs from the sum of their line items.",
    "Rank stores by year-over-year growth.",
    "Find the busiest hour of the day for each weekday.",
    "Flag transactions more than three standard deviations above a user's mean.",
    "Return the percentage of orders shipped late per carrier.",
    "Find products never ordered.",
]

CODE_MULTI_FOLLOWUPS = [
    "Now add type annotations and unit tests.",
    "Can you make it faster for very large inputs? Explain the complexity.",
    "Rewrite it without recursion.",
]


def build_code() -> list[Line]:
    lines: list[Line] = []
    for li, lang in enumerate(CODE_LANGUAGES):
        tasks = SQL_TASKS if lang == "SQL" else CODE_TASKS
        for ti, task in enumerate(tasks):
            n = li * len(tasks) + ti
            prompt = f"{task} Use {lang}." if lang != "SQL" else f"{task} Use PostgreSQL."
            system = (
                (
                    f"You are a senior {lang} engineer. Prefer clear, idiomatic code "
                    "and explain trade-offs briefly."
                )
                if ti % 4 == 0
                else None
            )
            meta = {"language": lang.lower(), "task": ti} if n % 3 == 0 else None
            line_id = f"code-{lang.lower()}-{ti:02d}" if n % 2 == 0 else None
            if ti % 9 == 8 and lang != "SQL":
                messages = [
                    _user(prompt),
                    {
                        "role": "assistant",
                        "content": f"Here is a straightforward {lang} version, with comments on each step.",
                    },
                    _user(CODE_MULTI_FOLLOWUPS[li % len(CODE_MULTI_FOLLOWUPS)]),
                ]
            else:
                messages = [_user(prompt)]
            lines.append(_line(messages, id=line_id, meta=meta, system=system))
    # One code prompt in Japanese, replacing a generated one.
    lines[45] = _line(
        [
            _user(
                "Pythonで、与えられたリストから重複を取り除き、元の順序を保つ関数を"
                "書いてください。計算量も説明してください。"
            )
        ],
        id="code-ja-001",
    )
    return lines


# ---------------------------------------------------------------------------------------------
# reasoning: 80 prompts from four families of problems with numbers derived from the index.

REASONING_SYSTEM = "Think carefully, then give the final answer on its own line."


def _trains(i: int) -> str:
    a, b, d = 40 + 5 * (i % 7), 55 + 3 * (i % 5), 180 + 20 * (i % 6)
    return (
        f"Two trains leave stations {d} km apart at the same time and head towards each "
        f"other, one at {a} km/h and the other at {b} km/h. When and where do they meet?"
    )


def _mixture(i: int) -> str:
    x, y, p, q = 2 + i % 5, 3 + i % 4, 10 + 5 * (i % 4), 40 + 5 * (i % 3)
    return (
        f"A chemist mixes {x} litres of a {p}% acid solution with {y} litres of a {q}% "
        "solution. What is the concentration of the mixture, and how much pure water "
        "would bring it down to 15%?"
    )


def _logic(i: int) -> str:
    names = ["Alice", "Bilal", "Chen", "Dana", "Emre", "Fatima", "Gus", "Hana"]
    a, b, c = names[i % 8], names[(i + 3) % 8], names[(i + 5) % 8]
    # The names repeat every 8 problems, so the rule of the puzzle changes with each round.
    rule = [
        "Exactly one of them tells the truth.",
        "Exactly two of them tell the truth.",
        "At least one of them lies.",
    ][i // 8 % 3]
    return (
        f"{a} says: '{b} is lying.' {b} says: '{c} is lying.' {c} says: '{a} and {b} "
        f"are both lying.' {rule} Who is telling the truth? Show your reasoning."
    )


ESTIMATES = [
    "How many piano tuners work in a city of 2 million people?",
    "How many litres of water does a person drink in a lifetime?",
    "How many tokens would it take to write out every chess game played today?",
    "How long would it take to count to one billion out loud?",
    "How many golf balls fit in a school bus?",
]
ESTIMATE_FRAMINGS = [
    "Estimate, with your assumptions stated: {q}",
    "Give an order-of-magnitude answer and say which assumption matters most: {q}",
    "Make a Fermi estimate, then give a low and a high bound: {q}",
    "Estimate this two independent ways and compare the results: {q}",
]


def _estimate(i: int) -> str:
    framing = ESTIMATE_FRAMINGS[i // len(ESTIMATES) % len(ESTIMATE_FRAMINGS)]
    return framing.format(q=ESTIMATES[i % len(ESTIMATES)])


REASONING_FAMILIES = [_trains, _mixture, _logic, _estimate]


def build_reasoning() -> list[Line]:
    lines: list[Line] = []
    for i in range(80):
        family = REASONING_FAMILIES[i % len(REASONING_FAMILIES)]
        text = family(i // len(REASONING_FAMILIES))
        system = REASONING_SYSTEM if i % 3 == 0 else None
        if i % 10 == 9:
            messages = [
                _user(text),
                {"role": "assistant", "content": "Let me set up the problem before solving it."},
                _user("Go on, and check your answer at the end."),
            ]
        else:
            messages = [_user(text)]
        lines.append(_line(messages, id=f"r-{i:03d}" if i % 4 == 1 else None, system=system))
    lines[42] = _line(
        [
            _user(
                "Ein Laden senkt den Preis um 20 % und erhöht ihn danach um 20 %. "
                "Ist der Endpreis höher, niedriger oder gleich? Begründe."
            )
        ]
    )
    lines[67] = _line(
        [
            _user(
                "3人の兄弟の年齢の合計は36歳で、長男は次男より4歳上、次男は三男より"
                "4歳上です。それぞれ何歳ですか？"
            )
        ],
        system=REASONING_SYSTEM,
    )
    return lines


BUILDERS = {"chat": build_chat, "code": build_code, "reasoning": build_reasoning}


def render(lines: list[Line]) -> bytes:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode("utf-8")


def write(out_dir: Path = DEFAULT_OUT) -> dict[str, Path]:
    written: dict[str, Path] = {}
    for name, build in BUILDERS.items():
        folder = out_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "prompts.jsonl"
        path.write_bytes(render(build()))
        written[name] = path
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else DEFAULT_OUT
    for name, path in write(out).items():
        count = path.read_bytes().count(b"\n")
        print(f"{name}: {count} prompts -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
