"""Reconciliation: the meter proved against the providers' own usage reports.

``fetch_pages`` reads a provider's admin usage report (every page), ``read_report``
checks it whole into :class:`ProviderUsage` rows (``read_bedrock_cur`` and
``read_gemini_export``: the rows of billing exports, Gemini's SKUs through
``load_sku_table``), ``open_store`` keeps imports (a repeated
or overlapping one replaces the days it covers) and runs in ClickHouse, and ``reconcile``
matches day × credential (``load_mapping``) × model × tier × token class against the
ledger's ``usage_events``, each delta explained by its cause (``CAUSES``) or named as the
residual. See README.md here. Code outside the room imports these names only.
"""

from reconcile.alerts import ALERT_KIND, drift_alerts
from reconcile.effective_prices import effective_price_map, price_map_text
from reconcile.fetch import fetch_pages
from reconcile.gemini_export import (
    GeminiExport,
    SkuTable,
    load_sku_table,
    read_gemini_export,
    sku_table_from_data,
)
from reconcile.mapping import CredentialMapping, load_mapping, mapping_from_data
from reconcile.matching import (
    CAUSES,
    Cell,
    CostCell,
    DaySummary,
    LedgerCell,
    ledger_sql,
    long_context_sql,
    match,
    match_costs,
)
from reconcile.provider_reports import (
    IMPORT_PROVIDERS,
    PROVIDERS,
    TOKEN_CLASSES,
    CostReport,
    ProviderCost,
    ProviderReport,
    ProviderUsage,
    ReportError,
    read_bedrock_cur,
    read_cost_report,
    read_report,
    report_kind,
)
from reconcile.run import Reconciliation, import_report, reconcile, render_table
from reconcile.store import ReconcileStore, StoreError, open_store

__all__ = [
    "ALERT_KIND",
    "CAUSES",
    "IMPORT_PROVIDERS",
    "PROVIDERS",
    "TOKEN_CLASSES",
    "Cell",
    "CostCell",
    "CostReport",
    "CredentialMapping",
    "DaySummary",
    "GeminiExport",
    "LedgerCell",
    "ProviderCost",
    "ProviderReport",
    "ProviderUsage",
    "ReconcileStore",
    "Reconciliation",
    "ReportError",
    "SkuTable",
    "StoreError",
    "drift_alerts",
    "effective_price_map",
    "fetch_pages",
    "import_report",
    "ledger_sql",
    "load_mapping",
    "load_sku_table",
    "long_context_sql",
    "mapping_from_data",
    "match",
    "match_costs",
    "open_store",
    "price_map_text",
    "read_bedrock_cur",
    "read_cost_report",
    "read_gemini_export",
    "read_report",
    "reconcile",
    "render_table",
    "report_kind",
    "sku_table_from_data",
]
