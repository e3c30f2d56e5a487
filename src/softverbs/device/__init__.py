"""The device: the authority over one HCA's objects, and its operations."""
