"""One model on every host, by content: each host's model identity taken there, compared here.

The items and the digest are engine/host/scripts/identity.py's (the same module runs on the host);
this side adds the weight version the servers are launched with, and refuses hosts whose models
differ before anything is launched on any of them, naming both hosts and the first file that
differs (docs/gpu-host.md, "One model"). Equal digests at different paths are one model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from regen.engine.host.errors import HostError, ModelMismatch
from regen.engine.host.scripts import identity as items_of
from regen.engine.host.ssh import HostConnection

_SHORT = 16  # characters of a sha256 shown in a message: enough to tell two apart


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """One host's model: where its folder is, what it holds (``items``) and their ``digest``."""

    host: str
    path: str
    items: tuple[tuple[str, str], ...]
    digest: str

    @classmethod
    def of(cls, host: str, record: dict[str, object], weight_version: str | None) -> ModelIdentity:
        """From the host script's record; raises HostError when the folder cannot be read."""
        path = str(record.get("path"))
        if not record.get("exists"):
            raise HostError(f"{host}: model_path {path} does not exist")
        if record.get("error"):
            raise HostError(f"{host}: model_path {path}: {record['error']}")
        raw = record.get("items")
        listed = raw if isinstance(raw, list) else []
        items = items_of.with_weight_version([(str(n), str(v)) for n, v in listed], weight_version)
        return cls(host, path, tuple((n, v) for n, v in items), items_of.digest(items))


def _shown(value: str | None) -> str:
    if value is None:
        return "absent"
    kind, _, rest = value.partition(":")
    return f"{kind}:{rest[:_SHORT]}" if kind == "sha256" else value


def mismatch(identities: Sequence[ModelIdentity]) -> str | None:
    """Why ``identities`` are not one model (both hosts, the first item that differs), or None."""
    if not identities:
        return None
    first = identities[0]
    for other in identities[1:]:
        if other.digest == first.digest:
            continue
        differs = items_of.first_difference(first.items, other.items)
        name, mine, theirs = differs if differs is not None else ("the digest", first.digest, other.digest)
        return (
            f"{first.host} and {other.host} hold different models: {name} differs "
            f"({_shown(mine)} on {first.host} at {first.path}, {_shown(theirs)} on {other.host} at {other.path})"
        )
    return None


async def take_identity(conn: HostConnection, weight_version: str | None) -> ModelIdentity:
    """The host's model identity, taken on the host; raises HostError."""
    host = conn.host
    if not host.model_path:
        raise HostError(f"{host.name}: model_path is not set in its [[hosts]] table")
    result = await conn.hostcmd(["identity", host.model_path])
    return ModelIdentity.of(host.name, dict(result.one("identity")), weight_version)


async def one_model(conns: Sequence[HostConnection], weight_version: str | None) -> ModelIdentity | None:
    """Every host's identity at once; the first host's when they are one model (None with no host),
    else ModelMismatch."""
    identities = await asyncio.gather(*(take_identity(c, weight_version) for c in conns))
    problem = mismatch(identities)
    if problem is not None:
        raise ModelMismatch(problem)
    return identities[0] if identities else None


__all__ = ["ModelIdentity", "mismatch", "one_model", "take_identity"]
