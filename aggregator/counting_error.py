"""The counting stage's one error: it cannot go on, so the worker must stop."""

from __future__ import annotations


class CountingError(Exception):
    """The counting stage cannot go on (a delivery failed): the worker must stop."""
