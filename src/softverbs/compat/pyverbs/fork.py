"""``pyverbs.fork``: fork support (always safe on softverbs: nothing is pinned)."""

from softverbs.verbs.fork import fork_init, is_fork_initialized

__all__ = ["fork_init", "is_fork_initialized"]
