"""`python -m inwire.cli`, the same as `inwire`."""

import sys

from . import main

sys.exit(main())
