"""``python -m softverbs`` is the ``softverbs`` command."""

import sys

from softverbs.cli.main import main

sys.exit(main())
