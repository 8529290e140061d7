"""The spend console: HTML pages at ``/`` of the admin server, over the admin API's own
handlers (admin/console/views.py)."""

from __future__ import annotations

from admin.console.views import mount_console

__all__ = ["mount_console"]
