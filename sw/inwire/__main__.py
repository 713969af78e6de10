"""`python -m inwire`, the same as `inwire`."""

import sys

from .cli import main

sys.exit(main())
