"""``python -m softverbs.service`` starts the device service, ``softverbsd``.

The one way every launcher starts it (:func:`softverbs.config.service_command`: the
on-demand start, ``softverbs service start``, the C library's spawn, the
tests).  This file is never compiled: ``python -m`` cannot run a compiled
module (softverbs.compiled), so ``softverbs.service.server`` is imported.
"""

import sys

from softverbs.service.server import main

sys.exit(main())
