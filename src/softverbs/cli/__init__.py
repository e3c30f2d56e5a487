"""The ``softverbs`` command."""
