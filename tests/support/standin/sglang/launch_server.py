"""Stand-in for `python -m sglang.launch_server`: SGLang's flags, the simulator behind them.

Runs with the standard library plus regen's own packages; when `regen` is not importable (regen not
installed in this Python), the `src/` folder of the repository this file lives in is put on the path.
"""

import sys
from pathlib import Path


def _engine_importable() -> None:
    try:
        import regen.sim.sglang.launch  # noqa: F401
    except ImportError:
        repository = Path(__file__).resolve().parents[4]  # this file is tests/support/standin/sglang/...
        sys.path.insert(0, str(repository / "src"))


if __name__ == "__main__":
    _engine_importable()
    from regen.sim.sglang.launch import main

    sys.exit(main())
