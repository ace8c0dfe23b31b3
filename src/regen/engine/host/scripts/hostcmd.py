"""The entry point regen runs on a GPU host: ``hostcmd.py COMMAND ARG...``, JSON lines on stdout.

Shipped on stdin with the modules it imports (docs/gpu-host.md, "Running code on the host"); its
arguments arrive as argv, so a dataset named ``$(touch x)`` is only ever a string here.

    inspect DATA_ROOT MODEL_PATH [NAME...]   one "dataset" record per dataset, then "host", then "done"
    status DATA_ROOT MODEL_PATH              GPUs and disk, for the console's polls
    datasets DATA_ROOT                       the datasets under DATA_ROOT
    tokenizer MODEL_PATH                     the model folder's tokenizer files
    manifest DATA_ROOT MODEL_PATH pull|push|tokenizer [NAME...]
                                             what a pull or push needs in one call: the datasets
                                             with the size and sha256 of their files, and (pull)
                                             the tokenizer files with theirs; "tokenizer": those
                                             files alone (what a run fetches), no dataset read
    digest PATH PREFIX [PATH PREFIX...]      size and sha256 of each file (PREFIX "" for all of it)
    identity MODEL_PATH                      the model folder's identity by content (identity.py)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from regen.engine.data.datasets import RESULTS_FILE
from regen.engine.host.scripts import identity, probe, survey


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _inspect(data_root: str, model_path: str, names: Sequence[str]) -> None:
    listing = probe.list_datasets(data_root)
    wanted = set(names)
    for ds in listing["datasets"]:
        if wanted and ds["name"] not in wanted:
            continue
        head = {"type": "dataset", "name": ds["name"], "path": ds["path"], "name_problem": ds["name_problem"]}
        try:
            record = survey.survey(ds["prompts"])
            record["results"] = survey.results_coverage(ds["path"], record["lines"])
        except OSError as exc:  # one unreadable dataset is a finding; the others are still checked
            _emit(head | {"error": f"cannot read: {exc.strerror or exc}"})
            continue
        _emit(head | record)
    gpus = probe.gpus()
    _emit(
        {
            "type": "host",
            "data_root": {
                "path": listing["path"],
                "error": listing["error"],
                "datasets": len(listing["datasets"]),
            },
            "unknown_datasets": sorted(wanted - {d["name"] for d in listing["datasets"]}),
            "gpus": gpus["gpus"],
            "gpu_error": gpus["error"],
            "disk": {"data_root": probe.disk(data_root), "model_path": probe.disk(model_path or None)},
            "model": probe.model_folder(model_path or None),
            "identity": identity.survey(model_path) if model_path else None,
            "versions": probe.versions(),
        }
    )


def _manifest(data_root: str, model_path: str, mode: str, names: Sequence[str]) -> None:
    # A run fetching the tokenizer reads no dataset: hashing every prompts.jsonl could take minutes.
    listing = (
        probe.list_datasets(data_root)
        if mode != "tokenizer"
        else {"path": data_root, "error": None, "datasets": []}
    )
    wanted = set(names)
    datasets = []
    for ds in listing["datasets"]:
        if wanted and ds["name"] not in wanted:
            continue
        entry = {k: ds[k] for k in ("name", "path", "name_problem")}
        entry["prompts"] = probe.file_digest(ds["prompts"])
        if mode == "push":
            entry["results"] = probe.file_digest(ds["path"] + "/" + RESULTS_FILE)
        datasets.append(entry)
    tokenizer = None
    if mode in ("pull", "tokenizer") and model_path:
        tokenizer = probe.tokenizer_files(model_path)
        for f in tokenizer["files"]:
            f.update(probe.file_digest(f["path"]))
    _emit(
        {
            "type": "manifest",
            "data_root": {"path": listing["path"], "error": listing["error"]},
            "datasets": datasets,
            "unknown_datasets": sorted(wanted - {d["name"] for d in listing["datasets"]}),
            "found": [d["name"] for d in listing["datasets"]],
            "tokenizer": tokenizer,
        }
    )


def _status(data_root: str, model_path: str) -> None:
    gpus = probe.gpus()
    _emit(
        {
            "type": "status",
            "gpus": gpus["gpus"],
            "gpu_error": gpus["error"],
            "disk": {"data_root": probe.disk(data_root), "model_path": probe.disk(model_path or None)},
        }
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = args[0], args[1:]
    try:
        if command == "inspect" and len(rest) >= 2:
            _inspect(rest[0], rest[1], rest[2:])
        elif command == "status" and len(rest) == 2:
            _status(rest[0], rest[1])
        elif command == "manifest" and len(rest) >= 3 and rest[2] in ("pull", "push", "tokenizer"):
            _manifest(rest[0], rest[1], rest[2], rest[3:])
        elif command == "datasets" and len(rest) == 1:
            _emit({"type": "datasets"} | probe.list_datasets(rest[0]))
        elif command == "identity" and len(rest) == 1:
            _emit({"type": "identity"} | identity.survey(rest[0]))
        elif command == "tokenizer" and len(rest) == 1:
            _emit({"type": "tokenizer"} | probe.tokenizer_files(rest[0]))
        elif command == "digest" and rest and len(rest) % 2 == 0:
            for path, prefix in zip(rest[::2], rest[1::2], strict=True):
                _emit({"type": "digest"} | probe.file_digest(path, int(prefix) if prefix else None))
        else:
            print(f"hostcmd: bad arguments for {command!r}", file=sys.stderr)
            return 2
    except Exception as exc:  # one line back to regen, never a traceback on the operator's screen
        _emit({"type": "error", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    _emit({"type": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
