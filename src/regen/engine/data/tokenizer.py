"""The target model's tokenizer: prompt and output token ids for rows (docs/data-contract.md §5, §8).

Everything here goes through ``transformers.AutoTokenizer`` exactly as a trainer would load the same
folder, so ids written by regen are the ids the drafter trainer sees. Special tokens are resolved by
name at load time and checked to be single, known ids; nothing is hard-coded to Kimi.

``transformers`` is imported lazily: the ``regen`` command line and the job import this module
without paying for it until a tokenizer is really loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from regen.engine.data.pieces import PieceEncoder, encode_whole
from regen.engine.data.row import TokenizerBlock
from regen.engine.data.tiktoken_direct import DirectTiktoken, RanksFileError, check_ranks_file
from regen.engine.errors import RegenError

if TYPE_CHECKING:
    from regen.engine.config.settings import TokenizerSettings

__all__ = [
    "DEFAULT_END_OF_TURN",
    "THINK",
    "THINK_END",
    "TargetTokenizer",
    "TokenizeError",
    "TokenizerError",
    "TokenizerSpec",
    "hash_tokenizer_files",
]

DEFAULT_END_OF_TURN = "<|im_end|>"
THINK = "<think>"
THINK_END = "</think>"
FINISH_REASONS = ("stop", "length")
# Prompts the piece encoder (engine/data/pieces.py) is checked on at load: a system prompt and
# none, several turns, text around special tokens' strings, whitespace runs, non-ASCII.
PIECE_PROBES: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "What is 1+1?"},),
    ({"role": "user", "content": " Ünïcödé 東京 😀 <|im_end|>x</think> <think>inside the text<|"},),
    (
        {"role": "system", "content": "Be brief.\n"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!  "},
        {"role": "user", "content": "   spaces\n\n\ttabs   "},
    ),
)

# Files that define how text becomes ids. A tokenizer folder copied from the GPU host is often the
# whole model folder, so hashing "every file" would read hundreds of gigabytes of weights.
_TOKENIZER_FILE_NAMES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "tiktoken.model",
        "tokenizer.model",
        "spiece.model",
        "sentencepiece.bpe.model",
        "chat_template.jinja",
        "chat_template.json",
    }
)


class TokenizerError(RegenError, ValueError):
    """The tokenizer folder cannot be used; one line naming the folder and what to do."""


class TokenizeError(RegenError, ValueError):
    """One row could not be tokenized; the message names the row when known."""


def _quiet_transformers() -> None:
    # Without torch, transformers prints an advisory on import that reads like an error to an
    # operator; regen only needs its tokenizers.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # tiktoken's load_tiktoken_bpe keeps a copy of every file it reads under a temporary folder,
    # keyed by the file's path, and reads that copy next time: a tiktoken.model replaced in place (a
    # new `regen pull`) would load the old ranks under the new file's hash. An empty cache folder
    # turns the copy off (docs/data-contract.md §8.1); regen loads no tiktoken file from the web.
    os.environ["TIKTOKEN_CACHE_DIR"] = ""


def _auto_map_files(config: Mapping[str, Any]) -> set[str]:
    """Python files named by ``auto_map`` (``"tokenization_kimi.TikTokenTokenizer"`` → the .py)."""
    names: set[str] = set()
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, Mapping):
        return names
    for value in auto_map.values():
        refs = value if isinstance(value, list | tuple) else [value]
        for ref in refs:
            if isinstance(ref, str) and "." in ref:
                module = ref.split("--")[-1].rsplit(".", 1)[0]
                names.add(module.replace(".", "/") + ".py")
    return names


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as fh:
            config = json.load(fh)
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{folder}: tokenizer_config.json is unreadable: {exc}") from None
    if not isinstance(config, dict):
        raise TokenizerError(f"{folder}: tokenizer_config.json is not a JSON object")
    return config


def hash_tokenizer_files(folder: Path) -> dict[str, str]:
    """sha256 of each file in ``folder`` that defines the tokenizer or its chat template."""
    config = _read_config(folder)
    wanted = set(_auto_map_files(config))
    hashes: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if not entry.is_file():
            continue
        name = entry.name
        if (
            name in _TOKENIZER_FILE_NAMES
            or name in wanted
            or (name.startswith("tokenization_") and name.endswith(".py"))
            or name.endswith(".tiktoken")
        ):
            with open(entry, "rb") as fh:
                hashes[name] = hashlib.file_digest(fh, "sha256").hexdigest()
    return hashes


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Everything needed to load the same tokenizer again, e.g. in a worker process (picklable)."""

    path: Path
    name: str | None = None
    trust_remote_code: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    end_of_turn: str = DEFAULT_END_OF_TURN

    @classmethod
    def from_settings(
        cls,
        settings: TokenizerSettings,
        *,
        path: Path | None = None,
        end_of_turn: str | None = None,
    ) -> TokenizerSpec:
        folder = path if path is not None else settings.path
        if folder is None:
            raise TokenizerError("no tokenizer configured: set tokenizer.path to the tokenizer folder")
        kwargs = {"thinking": settings.thinking, **settings.chat_template_kwargs}
        return cls(
            path=Path(folder),
            name=settings.name,
            trust_remote_code=settings.trust_remote_code,
            template_kwargs=kwargs,
            end_of_turn=end_of_turn or settings.end_of_turn or DEFAULT_END_OF_TURN,
        )


class TargetTokenizer:
    """The target model's tokenizer, its chat template and its special ids, checked at load time."""

    def __init__(self, spec: TokenizerSpec) -> None:
        self.spec = spec
        self.path = spec.path
        folder = spec.path
        if not folder.exists():
            raise TokenizerError(f"{folder}: tokenizer folder does not exist")
        if not folder.is_dir():
            raise TokenizerError(
                f"{folder}: not a folder (tokenizer.path names the folder of tokenizer files)"
            )
        config = _read_config(folder)
        if not config and not (folder / "tokenizer.json").is_file():
            raise TokenizerError(f"{folder}: no tokenizer files (tokenizer_config.json or tokenizer.json)")
        needs_code = isinstance(config.get("auto_map"), Mapping) and "AutoTokenizer" in config["auto_map"]
        if needs_code and not spec.trust_remote_code:
            code = ", ".join(sorted(_auto_map_files(config))) or "its own Python code"
            raise TokenizerError(
                f"{folder}: this tokenizer runs {code} (auto_map in tokenizer_config.json); "
                "set tokenizer.trust_remote_code = true if you trust the files"
            )
        if (folder / "tiktoken.model").is_file():
            try:
                check_ranks_file(folder / "tiktoken.model")
            except RanksFileError as exc:
                raise TokenizerError(str(exc)) from None
        self._direct: DirectTiktoken | None = None
        self._tok = self._load(folder, spec.trust_remote_code)
        if not getattr(self._tok, "chat_template", None):
            raise TokenizerError(
                f"{folder}: the tokenizer has no chat template (tokenizer_config.json or chat_template.jinja)"
            )

        self.name = spec.name or folder.resolve().name
        self.template_kwargs = dict(spec.template_kwargs)
        self.thinking = bool(self.template_kwargs.get("thinking", False))
        self.is_fast = bool(getattr(self._tok, "is_fast", False))
        self.files_sha256 = hash_tokenizer_files(folder)

        eot = self._lookup(spec.end_of_turn)
        if eot is None:
            # Not every model calls its turn terminator <|im_end|>; its eos is the usual stand-in.
            eos = getattr(self._tok, "eos_token", None)
            eot = self._lookup(eos) if isinstance(eos, str) else None
            if eot is None:
                raise TokenizerError(
                    f"{folder}: end-of-turn token {spec.end_of_turn!r} is not in the vocabulary "
                    "and the tokenizer has no eos token"
                )
        self.end_of_turn_id, self.end_of_turn_text = eot
        think = self._lookup(THINK)
        think_end = self._lookup(THINK_END)
        self.think_id: int | None = think[0] if think else None
        self.think_end_id: int | None = think_end[0] if think_end else None
        if self.thinking and think_end is None:
            raise TokenizerError(
                f"{folder}: thinking is on but the tokenizer has no {THINK_END} token; "
                "set tokenizer.thinking = false for a model without thinking"
            )
        self.special_strings = self._special_strings()
        self._chat_template: str | None = None
        self._render_kwargs: dict[str, Any] = {}
        self._pieces: PieceEncoder | None = None
        if not self.is_fast:
            self._direct = DirectTiktoken.build(
                self._tok, self._encode_slow, self._decode_slow, self._probes()
            )
        self._render_fast = self._fast_renderer()

    @classmethod
    def from_settings(cls, settings: TokenizerSettings, *, path: Path | None = None) -> TargetTokenizer:
        return cls(TokenizerSpec.from_settings(settings, path=path))

    @staticmethod
    def _load(folder: Path, trust_remote_code: bool) -> Any:
        _quiet_transformers()
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - transformers is a dependency
            raise TokenizerError(f"{folder}: cannot import transformers: {exc}") from None
        try:
            # local_files_only: the folder is the tokenizer; never reach the Hub for a missing file.
            return AutoTokenizer.from_pretrained(  # type: ignore[no-untyped-call]
                str(folder), trust_remote_code=trust_remote_code, local_files_only=True
            )
        except Exception as exc:
            if "trust_remote_code" in str(exc):
                raise TokenizerError(
                    f"{folder}: this tokenizer runs its own Python code; "
                    "set tokenizer.trust_remote_code = true if you trust the files"
                ) from None
            raise TokenizerError(f"{folder}: cannot load the tokenizer: {_first_line(exc)}") from None

    def _lookup(self, token: str | None) -> tuple[int, str] | None:
        """``(id, token)`` when ``token`` is one known id that encoding the string also yields."""
        if not token:
            return None
        tid = self._tok.convert_tokens_to_ids(token)
        if isinstance(tid, list) or tid is None:
            return None
        unk = getattr(self._tok, "unk_token_id", None)
        if unk is not None and tid == unk and token != getattr(self._tok, "unk_token", None):
            return None
        tid = int(tid)
        # A token only in the vocabulary (not an added/special token) would be split by BPE when it
        # appears in text, so the retokenized ids would not contain it: refuse such a tokenizer.
        encoded = self.encode(token)
        if encoded != [tid]:
            raise TokenizerError(
                f"{self.path}: {token!r} has id {tid} but encodes to {encoded[:8]}; "
                "it must be a special token that text encoding keeps whole"
            )
        return tid, token

    def _special_strings(self) -> frozenset[str]:
        strings = set(getattr(self._tok, "all_special_tokens", []) or [])
        decoder = getattr(self._tok, "added_tokens_decoder", None) or {}
        for added in decoder.values():
            if getattr(added, "special", False):
                strings.add(str(added.content))
        strings.add(self.end_of_turn_text)
        if self.think_id is not None:
            strings.add(THINK)
        if self.think_end_id is not None:
            strings.add(THINK_END)
        return frozenset(s for s in strings if s)

    # -- the row's tokenizer block -------------------------------------------------------------

    def info(self) -> TokenizerBlock:
        """The row's ``tokenizer`` block (docs/data-contract.md §3)."""
        return {
            "name": self.name,
            "files_sha256": dict(self.files_sha256),
            "template_kwargs": dict(self.template_kwargs),
            "add_generation_prompt": True,
        }

    # -- encoding and decoding -----------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Text to ids; special-token strings become their single ids; no BOS/EOS added."""
        if self._direct is not None:
            return self._direct.encode(text)
        return self._encode_slow(text)

    def _encode_slow(self, text: str) -> list[int]:
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """``encode`` for many texts in one call (a fast tokenizer encodes them in parallel)."""
        if not texts:
            return []
        if self.is_fast:
            enc = self._tok(
                list(texts),
                add_special_tokens=False,
                return_attention_mask=False,
                return_token_type_ids=False,
            )
            return [list(ids) for ids in enc["input_ids"]]
        return [self.encode(t) for t in texts]

    def encode_text(self, text: str) -> list[int]:
        """``encode`` with special-token strings encoded as the ordinary text they spell."""
        return self.encode_text_batch([text])[0]

    def encode_text_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        if self._direct is not None:
            return [self._direct.encode_text(t) for t in texts]
        if self.is_fast:
            native = self._tok.backend_tokenizer
            # The Rust tokenizer's own switch; put back at once, for render_ids reads the same object.
            before = native.encode_special_tokens
            native.encode_special_tokens = True
            try:
                # tokenizers 0.21 on: the ids without the offsets (engine/data/pieces.py encode_whole).
                batch = getattr(native, "encode_batch_fast", None) or native.encode_batch
                return [list(e.ids) for e in batch(list(texts), add_special_tokens=False)]
            finally:
                native.encode_special_tokens = before
        return [
            [int(i) for i in self._tok.encode(t, add_special_tokens=False, split_special_tokens=True)]
            for t in texts
        ]

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text with special tokens kept and no space clean-up, so it inverts ``encode``."""
        if self._direct is not None:
            return self._direct.decode(ids)
        return self._decode_slow(ids)

    def _decode_slow(self, ids: Sequence[int]) -> str:
        return str(
            self._tok.decode(
                list(ids),
                skip_special_tokens=False,
                clean_up_tokenization_spaces=False,
                # Slow tokenizers otherwise put spaces around added tokens such as </think>.
                spaces_between_special_tokens=False,
            )
        )

    def decode_batch(self, seqs: Sequence[Sequence[int]]) -> list[str]:
        if self.is_fast and not self._tok.clean_up_tokenization_spaces:
            lists = [s if isinstance(s, list) else list(s) for s in seqs]
            return list(self._tok.backend_tokenizer.decode_batch(lists, skip_special_tokens=False))
        return [self.decode(s) for s in seqs]

    # -- prompts (§5.1) ------------------------------------------------------------------------

    def _template_kwargs(self, thinking: bool | None) -> dict[str, Any]:
        if thinking is None:
            return self.template_kwargs
        return {**self.template_kwargs, "thinking": thinking}

    def render(self, messages: Sequence[Mapping[str, Any]], thinking: bool | None = None) -> str:
        """The generation prompt as text: the chat template with ``add_generation_prompt``."""
        text = self._tok.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True, **self._template_kwargs(thinking)
        )
        return str(text)

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]], thinking: bool | None = None) -> list[int]:
        """``apply_chat_template(tokenize=True, add_generation_prompt=True, **template_kwargs)``."""
        out = self._tok.apply_chat_template(
            list(messages), tokenize=True, add_generation_prompt=True, **self._template_kwargs(thinking)
        )
        # A list in most transformers versions, a BatchEncoding in others (docs/data-contract.md §5.1).
        if isinstance(out, Mapping) or hasattr(out, "keys"):
            out = out["input_ids"]
        if out and isinstance(out[0], list):
            out = out[0]
        return [int(i) for i in out]

    def render_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """``prompt_ids`` for a request on the hot path, the same ids (tests compare them) for less:
        transformers' per-call wrapping (the special-tokens map rebuilt for every render, the
        batch-encode plumbing) costs more than rendering and encoding a short prompt."""
        if self._render_fast is None:
            return self.prompt_ids(messages)
        render, native = self._render_fast
        text = self._render_text(render, messages)
        if self._direct is not None:
            return self._direct.encode(text)
        if self._pieces is not None:
            return self._pieces.encode(text)
        return encode_whole(native, text)

    def _render_text(self, render: Any, messages: Sequence[Mapping[str, Any]]) -> str:
        rendered, _ = render(
            conversations=[list(messages)],
            tools=None,
            documents=None,
            chat_template=self._chat_template,
            return_assistant_tokens_mask=False,
            continue_final_message=False,
            add_generation_prompt=True,
            **self._render_kwargs,
        )
        return str(rendered[0])

    def _probes(self) -> list[str]:
        """Texts a faster path is checked on at load against transformers' own: the probe prompts
        rendered, and the special tokens' strings alone and inside text."""
        texts = [str(s) for s in sorted(self.special_strings)]
        texts.append("x".join(texts) + " tail")
        for messages in PIECE_PROBES:
            try:
                texts.append(self.render(messages))
            except Exception:  # a template may refuse a shape (a system turn, say): the others check
                continue
        return texts

    def _fast_renderer(self) -> tuple[Any, Any] | None:
        """transformers' own template renderer and the Rust tokenizer (or the direct tiktoken
        path), when there; with the Rust one, the piece encoder (engine/data/pieces.py) where this
        tokenizer allows it."""
        native = getattr(self._tok, "backend_tokenizer", None) if self.is_fast else None
        try:
            from transformers.utils.chat_template_utils import render_jinja_template
        except ImportError:  # pragma: no cover - older transformers: the plain path
            return None
        if native is None and self._direct is None:
            return None
        self._chat_template = self._tok.get_chat_template(None, None)
        # What apply_chat_template passes the template: the special tokens, then our kwargs.
        self._render_kwargs = {**self._tok.special_tokens_map, **self.template_kwargs}
        if native is None:
            return render_jinja_template, None
        probes: list[str] = []
        for messages in PIECE_PROBES:
            try:
                probes.append(self._render_text(render_jinja_template, messages))
            except Exception:  # a template may refuse a shape (a system turn, say): the others check
                continue
        if probes:
            self._pieces = PieceEncoder.build(native, [*probes, *self.special_strings])
        return render_jinja_template, native

    def generation_suffix(self, thinking: bool | None = None) -> list[int]:
        """The ids every generation prompt ends with (e.g. ``<|im_end|><|im_assistant|>assistant
        <|im_middle|><think>`` for Kimi in thinking mode): the common tail of two renders."""
        a = self.prompt_ids([{"role": "user", "content": "a"}], thinking)
        b = self.prompt_ids([{"role": "user", "content": "b"}], thinking)
        k = 0
        while k < min(len(a), len(b)) and a[-1 - k] == b[-1 - k]:
            k += 1
        return a[len(a) - k :] if k else []

    # -- outputs (§5.2, §5.3) ------------------------------------------------------------------

    def output_parts(
        self, reasoning: str, content: str, finish_reason: str, thinking: bool | None = None
    ) -> tuple[list[str], bool]:
        """``(parts, append end-of-turn?)``: the texts a row's ``reasoning`` and ``content`` stand
        for, per the table of docs/data-contract.md §5.3, that one ``</think>`` joins (the reasoning
        and the content, or one of them alone)."""
        if finish_reason not in FINISH_REASONS:
            raise TokenizeError(f"finish_reason {finish_reason!r} is neither stop nor length")
        thinking = self.thinking if thinking is None else thinking
        reasoning = reasoning or ""
        content = content or ""
        if not thinking:
            return [content], finish_reason == "stop"
        if self.think_end_id is None:
            raise TokenizeError(f"thinking row but the tokenizer has no {THINK_END} token")
        if finish_reason == "stop":
            return [reasoning, content], True
        if content:
            return [reasoning, content], False
        # Cut off while still thinking: whether </think> was emitted is unknown, so it is left out.
        return [reasoning], False

    def output_text(
        self, reasoning: str, content: str, finish_reason: str, thinking: bool | None = None
    ) -> tuple[str, bool]:
        """``(text_out, append end-of-turn?)``: the parts joined by ``</think>`` (what `regen verify`
        decodes the ids against)."""
        parts, append = self.output_parts(reasoning, content, finish_reason, thinking)
        return THINK_END.join(parts), append

    def join_parts(self, encoded: Sequence[list[int]], append: bool) -> list[int]:
        """The output ids of the parts' ids: one ``</think>`` id between two, the end of turn after."""
        ids = list(encoded[0])
        for part in encoded[1:]:
            assert self.think_end_id is not None  # output_parts gave two parts only then
            ids.append(self.think_end_id)
            ids.extend(part)
        if append:
            ids.append(self.end_of_turn_id)
        return ids

    def retokenize(
        self, reasoning: str, content: str, finish_reason: str, thinking: bool | None = None
    ) -> tuple[list[int], bool]:
        """``output_ids`` and ``terminator_appended`` encoded from a row's text, for a row whose
        backend sent no ids (``output_ids_source: "retokenized"``, §5.3). The text is encoded as text:
        a special token's string inside it (a look-alike the model wrote in ordinary tokens, for a
        provider's text never holds the special tokens themselves) stays its ordinary tokens, and
        the only special ids are the ``</think>`` and end of turn the table puts there."""
        parts, append = self.output_parts(reasoning, content, finish_reason, thinking)
        return self.join_parts(self.encode_text_batch(parts), append), append

    def keep_server_ids(
        self, output_ids: Sequence[int], finish_reason: str, thinking: bool | None = None
    ) -> tuple[list[int], bool, str, str]:
        """``(output_ids, terminator_appended, reasoning, content)``: the server's own ids kept and
        terminated, and the text they decode to split (``output_ids_source: "server"``, §5.2)."""
        ids = [int(i) for i in output_ids]
        appended = self.terminate(ids, finish_reason)
        body = ids[:-1] if finish_reason == "stop" else ids
        reasoning, content = self.split_text(self.decode(body), thinking)
        return ids, appended, reasoning, content

    def terminate(self, ids: list[int], finish_reason: str) -> bool:
        if finish_reason not in FINISH_REASONS:
            raise TokenizeError(f"finish_reason {finish_reason!r} is neither stop nor length")
        # Every ok row ends with the turn terminator, whether or not the server kept the stop id.
        if finish_reason == "stop" and (not ids or ids[-1] != self.end_of_turn_id):
            ids.append(self.end_of_turn_id)
            return True
        return False

    def split_text(self, text: str, thinking: bool | None = None) -> tuple[str, str]:
        """``(reasoning, content)``: split at the first ``</think>``; none means still thinking."""
        thinking = self.thinking if thinking is None else thinking
        if not thinking:
            return "", text
        k = text.find(THINK_END)
        if k < 0:
            return text, ""
        return text[:k], text[k + len(THINK_END) :]
