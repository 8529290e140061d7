"""Publish keyed records and wait for their acks: runtime/compacted.py, named here too for
the commands and tests that import it from the stack."""

from __future__ import annotations

from runtime.compacted import publish

__all__ = ["publish"]
