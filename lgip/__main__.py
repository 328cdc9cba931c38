"""`python -m lgip ...`: the `lgip` console command (lgip.command)."""

import sys

from .command import main

sys.exit(main())
