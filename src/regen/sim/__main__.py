from __future__ import annotations

import sys

from regen.sim.runner import main

if __name__ == "__main__":
    sys.exit(main())
