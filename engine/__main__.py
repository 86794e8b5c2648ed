"""`python -m engine`: the `prune` command line."""

import sys

from engine.cli import main

sys.exit(main())
