"""The `spendbus` command: a thin layer over the stages and the local stack.

Each command's module is imported only when that command runs (or shows its own help):
`spendbus --help` and `spendbus price` load click and what they use, not every room
(spendbus/lazy_group.py).
"""

from __future__ import annotations

import os
import sys
from typing import Final

import click

from runtime.log_redaction import install_log_redaction
from runtime.private_files import PRIVATE_UMASK
from schemas.errors import ConfigError, SpendbusError
from spendbus.lazy_group import LazyCommand, LazyGroup

#: every command: where it lives and the first paragraph of its help, which is what
#: `spendbus --help` shows of it (tests/cli/test_lazy_commands.py holds them to the commands)
COMMANDS: Final = {
    "acls": LazyCommand(
        "spendbus.commands.acls:acls",
        "The Kafka ACL bindings a role needs; --apply creates them.",
    ),
    "admin": LazyCommand(
        "spendbus.cli:admin_group",
        "The admin API over HTTP (`admin serve`), its tokens and its audit trail.",
    ),
    "aggregator": LazyCommand(
        "spendbus.commands.aggregator:aggregator",
        "The stream processor that prices usage and keeps the budget counters.",
    ),
    "approvals": LazyCommand(
        "spendbus.commands.approvals:approvals",
        "Jobs a spend policy held for approval: list them, approve (a raise) or deny.",
    ),
    "budgets": LazyCommand(
        "spendbus.cli:budgets_group",
        "Budget policies on the compacted budget.policies topic; `budgets validate FILE` "
        "checks a file with no broker.",
    ),
    "check": LazyCommand(
        "spendbus.commands.enforcer:check",
        "Print the decision for one request as JSON (exit 0 allowed, 2 refused, 1 error).",
    ),
    "demo": LazyCommand(
        "spendbus.commands.stack:demo",
        "The whole pipeline on the embedded default, checked end to end.",
    ),
    "dlq": LazyCommand(
        "spendbus.commands.dlq:dlq",
        "Dead letters: what the aggregator could not read or price, with the reason.",
    ),
    "down": LazyCommand("spendbus.commands.stack:down", "Stop what `spendbus up` started."),
    "enforcer": LazyCommand(
        "spendbus.commands.enforcer:enforcer",
        "The budget enforcer: its HTTP sidecar for proxies in other languages.",
    ),
    "fake-upstream": LazyCommand(
        "spendbus.commands.fake_upstream:fake_upstream",
        "Serve Anthropic, OpenAI, Gemini and Bedrock endpoints with their real wire formats.",
    ),
    "gateway": LazyCommand(
        "spendbus.commands.gateway:gateway",
        "The reference gateway: an LLM proxy that checks budgets and meters every call.",
    ),
    "ingest": LazyCommand(
        "spendbus.commands.ingest:ingest",
        "Publish UsageEvents: `ingest FILE.jsonl` or `ingest serve` (HTTP for other languages).",
    ),
    "jobs": LazyCommand(
        "spendbus.commands.approvals:jobs",
        "Jobs (session budgets' counters) by opaque key, with their count against the ceiling.",
    ),
    "keys": LazyCommand(
        "spendbus.commands.keys:keys",
        "Virtual keys of the gateways on the compacted gateway.keys topic (keyed digests, "
        "never in clear).",
    ),
    "notify": LazyCommand(
        "spendbus.commands.notify:notify",
        "Deliver budget alerts to webhooks (Slack-compatible), each once per webhook.",
    ),
    "price": LazyCommand(
        "spendbus.commands.pricing:price",
        "Print what one call costs, as JSON: {cost_nanos, cost_usd, price_version, matched, "
        "unpriced} (and the units and service_tier when given; with --rates, the entry's "
        "rates; with --explain, why that entry).",
    ),
    "prices": LazyCommand(
        "spendbus.cli:prices_group",
        "Price versions: publish them (apply), find models a price file does not price "
        "(check), import a community price map as a new version (import), list what "
        "changed (diff).",
    ),
    "replay": LazyCommand(
        "spendbus.commands.replay:replay",
        "Rebuild every counter, verdict and ClickHouse table from usage.raw into a new generation.",
    ),
    "snapshot": LazyCommand(
        "spendbus.commands.replay:snapshot",
        "Fold the ledger from the latest snapshot (or offset 0) and write a new counter snapshot.",
    ),
    "reconcile": LazyCommand(
        "spendbus.cli:reconcile_group",
        "The providers' usage reports against the ledger: `reconcile fetch` or `import`, then "
        "`reconcile report`.",
    ),
    "sql": LazyCommand(
        "spendbus.commands.admin:sql",
        "Run an analyst QUERY on ClickHouse (through the running worker when it owns the store).",
    ),
    "status": LazyCommand(
        "spendbus.commands.status:status",
        "Brokers, topics, consumer lag, workers, verdict freshness, DLQ and ClickHouse.",
    ),
    "tap": LazyCommand(
        "spendbus.commands.tap:tap", "Inspect the usage taps that meter LLM responses."
    ),
    "topics": LazyCommand(
        "spendbus.commands.topics:topics",
        "The topics spendbus creates, and their replication (runtime/replication.py).",
    ),
    "up": LazyCommand(
        "spendbus.commands.stack:up",
        "Start the local stack: Kafka (unless KAFKA_BOOTSTRAP is set), topics, an aggregator "
        "worker.",
    ),
    "usage": LazyCommand(
        "spendbus.commands.admin:usage",
        "Budget counters with their spend, limits, raise, reset and forecast: every live "
        "counter (of --org-id, of --budget), or with --org-id and --secret-id the ones a "
        "request of that context counts in, from the enforcer itself.",
    ),
    "verify": LazyCommand(
        "spendbus.commands.admin:verify",
        "Recompute every counter from usage.raw and compare with the live verdicts and with "
        "every period of ClickHouse's budget_history (read-only).",
    ),
}


#: `spendbus budgets`' commands, loaded the same way: `budgets validate` runs in CI with no
#: broker, so it must not load the Kafka clients the other commands need
BUDGETS_COMMANDS: Final = {
    "apply": LazyCommand(
        "spendbus.commands.budgets:budgets_apply",
        "Validate FILE (a YAML list of budgets) and publish every budget in it.",
    ),
    "delete": LazyCommand(
        "spendbus.commands.budgets:budgets_delete",
        "Delete a budget (a tombstone on budget.policies).",
    ),
    "list": LazyCommand("spendbus.commands.budgets:budgets_list", "The live budgets."),
    "raise": LazyCommand(
        "spendbus.commands.budget_raises:budgets_raise",
        "Raise a budget's limits (one counter with --scope, else every counter) until --until.",
    ),
    "raises": LazyCommand(
        "spendbus.commands.budget_raises:budgets_raises",
        "Every raise on budget.raises (active, expired and revoked), oldest first.",
    ),
    "revoke-raise": LazyCommand(
        "spendbus.commands.budget_raises:budgets_revoke_raise",
        "End a budget's active raises now (the records stay on the topic, marked revoked).",
    ),
    "validate": LazyCommand(
        "spendbus.commands.budget_validate:budgets_validate",
        "Check FILE (a YAML list of budgets) as `budgets apply` would, with no broker.",
    ),
}


#: `spendbus admin`'s commands (the admin API, admin/; the operator's sql, usage and
#: verify are top-level commands of spendbus/commands/admin.py)
ADMIN_COMMANDS: Final = {
    "audit": LazyCommand(
        "spendbus.commands.admin_api:admin_audit",
        "Every change the admin API made, oldest first: who (token, role), what (before and "
        "after), when, from where (the admin.audit topic; in SQL: the admin_audit table).",
    ),
    "serve": LazyCommand(
        "spendbus.commands.admin_api:admin_serve",
        "Serve the admin API on loopback: budgets, keys, raises and the audit trail under "
        "/v1/admin/, its OpenAPI document at /openapi.json.",
    ),
    "tokens": LazyCommand(
        "spendbus.commands.admin_api:admin_tokens",
        "The admin API's bearer tokens (stored as keyed digests only).",
    ),
}

#: `spendbus reconcile`'s commands, loaded the same way
RECONCILE_COMMANDS: Final = {
    "fetch": LazyCommand(
        "spendbus.commands.reconcile:reconcile_fetch",
        "Fetch PROVIDER's usage and cost reports (every page) since --since, and import them.",
    ),
    "import": LazyCommand(
        "spendbus.commands.reconcile:reconcile_import",
        "Import FILE: PROVIDER's usage or cost report as JSON pages (one page or a list of "
        'them), or both as `fetch --save` writes them ({"usage": [...], "costs": [...]}); '
        "for bedrock, the Bedrock rows of a CUR 2.0 export (CSV); for gemini, the rows of a "
        "Cloud Billing export to BigQuery (newline-delimited JSON or CSV).",
    ),
    "prices": LazyCommand(
        "spendbus.commands.reconcile:reconcile_prices",
        "Write a new price version at the rates the provider billed where only the price "
        "differs (cause `price`), through `prices import`'s path; `prices apply` publishes it.",
    ),
    "report": LazyCommand(
        "spendbus.commands.reconcile:reconcile_report",
        "Reconcile every imported day against the ledger: both sides, each delta and its "
        "cause, the residual no cause explains (stored in the `reconciliation` table).",
    ),
}


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spendbus")
def cli() -> None:
    """Meter and cap what LLM traffic costs."""


def budgets_group() -> click.Command:
    """`spendbus budgets`: its commands imported one by one, as they run."""
    return LazyGroup(name="budgets", lazy=BUDGETS_COMMANDS, help=COMMANDS["budgets"].summary)


def admin_group() -> click.Command:
    """`spendbus admin`: the admin API's commands, imported as they run."""
    return LazyGroup(name="admin", lazy=ADMIN_COMMANDS, help=COMMANDS["admin"].summary)


def reconcile_group() -> click.Command:
    """`spendbus reconcile`: its commands imported one by one, as they run."""
    return LazyGroup(name="reconcile", lazy=RECONCILE_COMMANDS, help=COMMANDS["reconcile"].summary)


def prices_group() -> click.Command:
    """`spendbus prices`: its checks, with apply (Kafka) and the price maps' commands."""
    from spendbus.commands.admin import prices_apply_command
    from spendbus.commands.prices_sync import prices_diff, prices_import, prices_update
    from spendbus.commands.pricing import prices

    for command in (prices_apply_command(), prices_import, prices_diff, prices_update):
        prices.add_command(command)
    return prices


#: authorization errors a command may meet on a cluster with ACLs (aiokafka.errors' names)
_KAFKA_REFUSALS: Final = (
    "TopicAuthorizationFailedError",
    "GroupAuthorizationFailedError",
    "ClusterAuthorizationFailedError",
    "TransactionalIdAuthorizationFailed",
)


def _kafka_failure(exc: Exception) -> ConfigError | None:
    """What to tell the user about a Kafka client error, or None for any other error.

    aiokafka is imported here only if a command already did: an exception cannot be one
    of its classes otherwise, and a command that never met Kafka does not load it.
    """
    if "aiokafka.errors" not in sys.modules:
        return None
    from aiokafka import errors

    if isinstance(exc, errors.KafkaConnectionError):
        # a traceback of the client's internals says less than this line
        return ConfigError(
            f"no Kafka broker answers ({exc}): check KAFKA_BOOTSTRAP, or start the local "
            "broker with `spendbus up` (its address is kept in SPENDBUS_HOME)"
        )
    if isinstance(exc, tuple(getattr(errors, name) for name in _KAFKA_REFUSALS)):
        # the cluster's ACLs said no: name what was refused and where the grants are
        return ConfigError(
            f"Kafka refused this principal: not authorized ({type(exc).__name__}: {exc}); "
            "the ACLs each role needs: `spendbus acls --role ROLE --principal User:NAME` "
            "(docs/security.md)"
        )
    return None


def main() -> None:
    # every log line of every command is rendered redacted: no credential header, bearer
    # token or virtual key reaches a log, whatever logged it (runtime/log_redaction.py)
    install_log_redaction()
    # what a command or the processes it starts write (the store, logs, spools) is theirs
    # alone: 0600 files, 0700 folders (runtime/private_files.py)
    os.umask(os.umask(PRIVATE_UMASK) | PRIVATE_UMASK)
    try:
        sys.exit(cli.main(standalone_mode=False) or 0)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except SpendbusError as exc:
        _fail(exc)
    except Exception as exc:
        failure = _kafka_failure(exc)
        if failure is None:
            raise
        _fail(failure)


def _fail(exc: SpendbusError) -> None:
    from spendbus.commands.output import fail  # rich: loaded when there is an error to show

    fail(exc)
