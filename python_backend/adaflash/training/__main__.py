"""`python -m adaflash.training ARGS` (what torchrun starts in each process): `adaflash train ARGS`."""

import sys

from adaflash.training.command import main

sys.exit(main())
