"""The reconciliation's own ClickHouse tables: the providers' usage and cost reports as
imported, and each reconciliation's cells (both sides and the delta of every token class, with its causes).

Imports replace, never add: each import writes its rows under a new ``import_id``, then one
``reconciliation_imports`` row per (provider, report, day) it covers; a read takes, per
(provider, report, day), the rows of the latest import (``argMax`` over ``imported_at``). A repeated or
overlapping import therefore replaces the days it covers, and an import that fails before
its coverage rows are written changes nothing. No FINAL, no mutation.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from runtime.clickhouse_access import DEFAULT_ACCESS, ClickHouseAccess, redact_dsn
from schemas.errors import ConfigError, SpendbusError

from .provider_reports import CostReport, ProviderCost, ProviderReport, ProviderUsage

DDL = (
    """
    CREATE TABLE IF NOT EXISTS reconciliation_provider_usage
    (
        import_id   String,
        provider    LowCardinality(String),
        day         Date,
        api_key_id  String,
        project     Nullable(String),
        model       String,
        tier        LowCardinality(String),
        token_class LowCardinality(String),
        amount      Int64
    )
    ENGINE = MergeTree
    ORDER BY (provider, day, import_id, api_key_id, model, tier, token_class)
    """,
    """
    CREATE TABLE IF NOT EXISTS reconciliation_provider_costs
    (
        import_id   String,
        provider    LowCardinality(String),
        day         Date,
        project     Nullable(String),
        model       String,
        tier        LowCardinality(String),
        token_class LowCardinality(String),
        nanos       Int64
    )
    ENGINE = MergeTree
    ORDER BY (provider, day, import_id, model, tier, token_class)
    """,
    """
    CREATE TABLE IF NOT EXISTS reconciliation_imports
    (
        provider    LowCardinality(String),
        report      LowCardinality(String),
        day         Date,
        import_id   String,
        imported_at DateTime64(6, 'UTC'),
        source      String
    )
    ENGINE = ReplacingMergeTree(imported_at)
    ORDER BY (provider, report, day)
    """,
    """
    CREATE TABLE IF NOT EXISTS reconciliation
    (
        run_id          String,
        reconciled_at   DateTime64(6, 'UTC'),
        provider        LowCardinality(String),
        day             Date,
        credential      String,
        api_key_id      String,
        model           String,
        tier            LowCardinality(String),
        token_class     LowCardinality(String),
        provider_amount Int64,
        spendbus_amount Int64,
        delta           Int64,
        causes          Array(LowCardinality(String))
    )
    ENGINE = MergeTree
    ORDER BY (run_id, provider, day, credential, model, tier, token_class)
    """,
)
#: the pseudo token class a provider's request count is stored under
REQUESTS = "requests"


class StoreError(SpendbusError):
    """The reconciliation store cannot be reached or refused a statement."""


def open_store(dsn: str, access: ClickHouseAccess = DEFAULT_ACCESS) -> ReconcileStore:
    """The store at ``dsn`` (``chdb:///abs/path`` or ``http(s)://...``), its tables created."""
    import clickhouse_connect

    parsed = urlparse(dsn)
    try:
        if parsed.scheme == "chdb":
            if parsed.netloc or not parsed.path.startswith("/"):
                raise ConfigError(f"reconciliation store {dsn!r}: expected chdb:///abs/path")
            Path(parsed.path).mkdir(parents=True, exist_ok=True)
            client = clickhouse_connect.get_client(interface="chdb", path=parsed.path)
        elif parsed.scheme in ("http", "https"):
            options: dict[str, Any] = {}
            if access.password is not None:
                options["password"] = access.password.get_secret_value()
            if parsed.scheme == "https":
                options["verify"] = access.verify
                for path, option in (
                    (access.ca_file, "ca_cert"),
                    (access.client_cert, "client_cert"),
                    (access.client_key, "client_cert_key"),
                ):
                    if path is not None:
                        options[option] = str(path)
            client = clickhouse_connect.get_client(dsn=dsn, interface=parsed.scheme, **options)
        else:
            raise ConfigError(
                f"reconciliation store {redact_dsn(dsn)!r}: expected chdb:///abs/path or http(s)://"
            )
    except ConfigError:
        raise
    except Exception as exc:
        raise StoreError(f"cannot open the reconciliation store {redact_dsn(dsn)}: {exc}") from exc
    store = ReconcileStore(client)
    for statement in DDL:
        store.command(statement)
    return store


class ReconcileStore:
    """The reconciliation tables on one clickhouse-connect client."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> None:
        try:
            self.client.command(sql, parameters=parameters)
        except Exception as exc:
            raise StoreError(f"the reconciliation store refused a statement: {exc}") from exc

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> list[Sequence[Any]]:
        try:
            return list(self.client.query(sql, parameters=parameters).result_rows)
        except Exception as exc:
            raise StoreError(f"the reconciliation store refused a query: {exc}") from exc

    def insert(self, table: str, rows: list[list[Any]], columns: Sequence[str]) -> None:
        if not rows:
            return
        try:
            self.client.insert(table, rows, column_names=list(columns))
        except Exception as exc:
            raise StoreError(f"cannot write {table}: {exc}") from exc

    def close(self) -> None:
        self.client.close()

    # -- the providers' reports ------------------------------------------------------------
    def import_report(self, report: ProviderReport, source: str) -> str:
        """Store ``report`` as the current one of every day it covers; its import id."""
        import_id = uuid.uuid4().hex
        rows: list[list[Any]] = []
        for row in report.rows:
            base = [
                import_id,
                row.provider,
                row.day,
                row.api_key_id,
                row.project,
                row.model,
                row.tier,
            ]
            rows += [[*base, cls, amount] for cls, amount in row.tokens.items()]
            if row.requests is not None:
                rows.append([*base, REQUESTS, row.requests])
        self.insert(
            "reconciliation_provider_usage",
            rows,
            (
                "import_id",
                "provider",
                "day",
                "api_key_id",
                "project",
                "model",
                "tier",
                "token_class",
                "amount",
            ),
        )
        self._cover(report.provider, "usage", report.days, import_id, source)
        return import_id

    def import_costs(self, report: CostReport, source: str) -> str:
        """Store a cost report as the current one of every day it covers; its import id."""
        import_id = uuid.uuid4().hex
        rows: list[list[Any]] = [
            [import_id, r.provider, r.day, r.project, r.model, r.tier, r.token_class, r.nanos]
            for r in report.rows
        ]
        self.insert(
            "reconciliation_provider_costs",
            rows,
            ("import_id", "provider", "day", "project", "model", "tier", "token_class", "nanos"),
        )
        self._cover(report.provider, "costs", report.days, import_id, source)
        return import_id

    def _cover(
        self, provider: str, kind: str, days: set[date], import_id: str, source: str
    ) -> None:
        # the coverage last: until it is written, the previous import stays current
        now = datetime.now(UTC)
        self.insert(
            "reconciliation_imports",
            [[provider, kind, day, import_id, now, source] for day in sorted(days)],
            ("provider", "report", "day", "import_id", "imported_at", "source"),
        )

    def covered_days(self, provider: str, kind: str = "usage") -> list[date]:
        rows = self.query(
            "SELECT DISTINCT day FROM reconciliation_imports "
            "WHERE provider = {p:String} AND report = {k:String} ORDER BY day",
            {"p": provider, "k": kind},
        )
        return [row[0] for row in rows]

    def provider_costs(self, provider: str, first: date, last: date) -> list[ProviderCost]:
        """The current cost import's rows of ``provider`` for the days in [first, last]."""
        rows = self.query(
            """
            SELECT u.day, u.model, u.tier, u.token_class, sum(u.nanos), any(u.project)
            FROM reconciliation_provider_costs AS u
            INNER JOIN
            (
                SELECT provider, day, argMax(import_id, imported_at) AS current
                FROM reconciliation_imports
                WHERE provider = {p:String} AND report = 'costs'
                  AND day BETWEEN {first:Date} AND {last:Date}
                GROUP BY provider, day
            ) AS c ON u.provider = c.provider AND u.day = c.day AND u.import_id = c.current
            WHERE u.provider = {p:String}
            GROUP BY u.day, u.model, u.tier, u.token_class
            ORDER BY u.day, u.model, u.tier, u.token_class
            """,
            {"p": provider, "first": first, "last": last},
        )
        return [
            ProviderCost(provider, day, model, tier, cls, int(nanos), project)
            for day, model, tier, cls, nanos, project in rows
        ]

    def provider_usage(self, provider: str, first: date, last: date) -> list[ProviderUsage]:
        """The current import's rows of ``provider`` for the days in [first, last]."""
        rows = self.query(
            """
            SELECT u.day, u.api_key_id, any(u.project), u.model, u.tier,
                   groupArray((u.token_class, u.amount))
            FROM reconciliation_provider_usage AS u
            INNER JOIN
            (
                SELECT provider, day, argMax(import_id, imported_at) AS current
                FROM reconciliation_imports
                WHERE provider = {p:String} AND report = 'usage'
                  AND day BETWEEN {first:Date} AND {last:Date}
                GROUP BY provider, day
            ) AS c ON u.provider = c.provider AND u.day = c.day AND u.import_id = c.current
            WHERE u.provider = {p:String}
            GROUP BY u.day, u.api_key_id, u.model, u.tier
            ORDER BY u.day, u.api_key_id, u.model, u.tier
            """,
            {"p": provider, "first": first, "last": last},
        )
        out = []
        for day, key_id, project, model, tier, amounts in rows:
            by_class = dict(amounts)
            requests = by_class.pop(REQUESTS, None)
            out.append(
                ProviderUsage(
                    provider=provider,
                    day=day,
                    api_key_id=key_id,
                    model=model,
                    tier=tier,
                    tokens={k: int(v) for k, v in by_class.items()},
                    requests=None if requests is None else int(requests),
                    project=project,
                )
            )
        return out
