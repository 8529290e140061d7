"""The admin API: budgets, virtual keys, raises and the audit trail over HTTP, fenced by
org (admin/README.md). The CLI reaches it through this face (`spendbus admin`)."""

from __future__ import annotations

from admin.openapi import openapi_document
from admin.reports import SpendQuery
from admin.server import DEFAULT_PORT, SERVER_OPTIONS, build_app, serve_admin
from admin.store import AdminConfig, AdminStore
from admin.tokens import ROLES, TokenBook, TokenRecord

__all__ = [
    "DEFAULT_PORT",
    "ROLES",
    "SERVER_OPTIONS",
    "AdminConfig",
    "AdminStore",
    "SpendQuery",
    "TokenBook",
    "TokenRecord",
    "build_app",
    "openapi_document",
    "serve_admin",
]
