"""The objects an application holds, shaped like pyverbs."""
