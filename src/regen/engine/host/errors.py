"""What can go wrong with a GPU host; every message is one line that names the host."""

from __future__ import annotations

from regen.engine.errors import RegenError


class HostError(RegenError):
    """A host could not do what was asked. ``state`` is the word the console shows."""

    state = "failed"
    # Whether trying again later can help (a dropped link can; a refused key cannot).
    retryable = False


class HostKeyRefused(HostError):
    """The server's host key is unknown or differs from known_hosts: nothing was run."""

    state = "host key refused"


class AuthFailed(HostError):
    """The server refused every key offered."""

    state = "auth failed"


class HostUnreachable(HostError):
    """No SSH session could be opened (refused, timed out, name not found, dropped and not back)."""

    state = "unreachable"
    retryable = True


class HostSetupError(HostError):
    """The host's settings cannot be used as given (a key file that cannot be read, ...)."""

    state = "bad settings"


class RemoteError(HostError):
    """A script on the host failed; the message says how."""

    state = "script failed"


class TransferError(HostError):
    """A pull or push was refused or did not verify."""

    state = "transfer failed"


class ModelMismatch(HostError):
    """The hosts of one job hold different models (by content, engine/host/identity.py)."""

    state = "different model"
