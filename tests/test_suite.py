"""The suite's two kinds (tests/support/kinds.py): the integration kind is the folder
tests/integration/, what starts first names files that exist there, and every test file sits in a
folder of its part, so a file dropped at the top of tests/ does not slip past the grouping."""

from __future__ import annotations

from tests.support.kinds import FIRST, INTEGRATION, ROOT

# The folders a test may live in (docs/architecture.md, "Tests"): the engine by part, the console, the
# command line, the simulators, and the integration kind; this file alone stands at the top.
PARTS = ("tests/engine/", "tests/console/", "tests/cli/", "tests/sim/", INTEGRATION)


def test_the_integration_folder_exists_and_what_starts_first_lives_there() -> None:
    assert (ROOT / INTEGRATION).is_dir()
    assert all((ROOT / path).exists() and path.startswith(INTEGRATION) for path in FIRST), FIRST


def test_every_test_file_is_in_the_folder_of_its_part() -> None:
    tests = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    astray = [path for path in tests if not path.startswith(PARTS) and path != "tests/test_suite.py"]
    assert not astray, f"test files outside the parts' folders: {astray}"


def test_every_folder_of_tests_is_a_package() -> None:
    # Without __init__.py two test modules of one name in different folders collide at collection.
    folders = {p.parent for p in (ROOT / "tests").rglob("test_*.py")}
    assert all((folder / "__init__.py").exists() for folder in folders)
