"""`python -m regen`: the `regen` command."""

import sys

from regen.cli.entry import main

sys.exit(main())
