"""Fixtures of the scenario tests; the helpers live in scenario_kit."""

from scenario_kit import ctx, pd, route  # noqa: F401 - pytest fixtures
