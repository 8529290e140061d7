"""The `spendbus` command: a thin layer over the stages and the local stack."""

from __future__ import annotations

import os
import sys

import click
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from runtime.http_log import install_log_redaction
from runtime.private_files import PRIVATE_UMASK
from schemas.errors import ConfigError, SpendbusError
from spendbus.commands.admin import prices_apply_command, sql, usage, verify
from spendbus.commands.aggregator import aggregator
from spendbus.commands.budgets import budgets
from spendbus.commands.output import fail
from spendbus.commands.stack import demo, down, up
from spendbus.commands.status import status


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spendbus")
def cli() -> None:
    """Meter and cap what LLM traffic costs."""


for command in (up, down, status, demo, sql, usage, verify, budgets, aggregator):
    cli.add_command(command)


def _register_optional() -> None:
    """Commands of the other rooms, each in its own module."""
    from spendbus.commands.acls import acls
    from spendbus.commands.dlq import dlq
    from spendbus.commands.enforcer import check, enforcer
    from spendbus.commands.fake_upstream import fake_upstream
    from spendbus.commands.gateway import gateway
    from spendbus.commands.ingest import ingest
    from spendbus.commands.keys import keys
    from spendbus.commands.notify import notify
    from spendbus.commands.prices_sync import prices_diff, prices_import, prices_update
    from spendbus.commands.pricing import price, prices
    from spendbus.commands.replay import replay, snapshot
    from spendbus.commands.tap import tap
    from spendbus.commands.topics import topics

    prices.add_command(prices_apply_command())
    prices.add_command(prices_import)
    prices.add_command(prices_diff)
    prices.add_command(prices_update)
    cli.add_command(price)
    cli.add_command(prices)
    cli.add_command(tap)
    cli.add_command(ingest)
    cli.add_command(fake_upstream)
    cli.add_command(enforcer)
    cli.add_command(check)
    cli.add_command(dlq)
    cli.add_command(gateway)
    cli.add_command(keys)
    cli.add_command(notify)
    cli.add_command(replay)
    cli.add_command(snapshot)
    cli.add_command(acls)
    cli.add_command(topics)


_register_optional()

#: authorization errors a command may meet on a cluster with ACLs
_KAFKA_REFUSALS = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)


def main() -> None:
    # every log line of every command is rendered redacted: no credential header, bearer
    # token or virtual key reaches a log, whatever logged it (runtime/http_log.py)
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
        fail(exc)
    except KafkaConnectionError as exc:
        # a traceback of the client's internals says less than this line
        fail(
            ConfigError(
                f"no Kafka broker answers ({exc}): check KAFKA_BOOTSTRAP, or start the local "
                "broker with `spendbus up` (its address is kept in SPENDBUS_HOME)"
            )
        )
    except _KAFKA_REFUSALS as exc:
        # the cluster's ACLs said no: name what was refused and where the grants are
        fail(
            ConfigError(
                f"Kafka refused this principal: not authorized ({type(exc).__name__}: {exc}); "
                "the ACLs each role needs: `spendbus acls --role ROLE --principal User:NAME` "
                "(docs/security.md)"
            )
        )
