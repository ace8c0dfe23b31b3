"""The suite's two kinds (tests/support/kinds.py): the integration list names only what exists, so a
test file renamed or moved does not slip into `make check` unnoticed."""

from __future__ import annotations

from tests.support.kinds import FIRST, INTEGRATION, ROOT


def test_every_path_the_integration_kind_names_exists() -> None:
    missing = [path for path in INTEGRATION if not (ROOT / path).exists()]
    assert not missing, f"tests/support/kinds.py names paths that are gone: {missing}"


def test_what_starts_first_exists_and_is_the_integration_kind() -> None:
    assert all((ROOT / path).exists() and path.startswith(INTEGRATION) for path in FIRST), FIRST
