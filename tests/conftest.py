"""Test-wide settings.

softverbs' devices are, by default, the host's: served by softverbsd, started
on demand on the user's socket.  The test suite must never touch a service
the user runs, nor leave one behind, so every test process -- and every
program it starts -- gets devices of its own (``SOFTVERBS_SERVICE=0``) unless
a test asks for a private service of its own (the host-device tests do).
"""

from __future__ import annotations

import os

os.environ["SOFTVERBS_SERVICE"] = "0"
