"""``python -m collector.cli``: the same as the ``flightrec`` command."""

import sys

from collector.cli import main

sys.exit(main())
