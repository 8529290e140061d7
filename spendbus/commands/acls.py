"""`spendbus acls --role R --principal P [--apply]`: least-privilege ACLs (docs/security.md).

Prints the bindings the role needs on this stack's topics (SPENDBUS_TOPIC_PREFIX) and
groups; ``--apply`` creates them through the admin API as the configured user (which must
be allowed to alter ACLs: a super user or ALTER on the cluster).
"""

from __future__ import annotations

import asyncio
import json

import click

from runtime.acls import ROLES, role_bindings


@click.command()
@click.option("--role", type=click.Choice(ROLES), required=True, help="What the principal runs.")
@click.option("--principal", required=True, help="The Kafka principal, e.g. User:gateway.")
@click.option("--app-id", help="The aggregator's base app id (default: from the topic prefix).")
@click.option("--apply", "apply_", is_flag=True, help="Create the bindings on the cluster.")
@click.option("--json", "as_json", is_flag=True, help="Print the bindings as JSON.")
def acls(role: str, principal: str, app_id: str | None, apply_: bool, as_json: bool) -> None:
    """The Kafka ACL bindings a role needs; --apply creates them."""
    from spendbus.settings import load_settings

    settings = load_settings()
    bindings = role_bindings(role, principal, settings.topics, app_id=app_id)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "resource_type": b.resource_type.name,
                        "resource_name": b.resource_name,
                        "pattern_type": b.pattern_type.name,
                        "operation": b.operation.name,
                        "principal": b.principal,
                        "host": b.host,
                        "permission": "ALLOW",
                    }
                    for b in bindings
                ],
                indent=2,
            )
        )
    else:
        for binding in bindings:
            click.echo(binding.describe())
    if apply_:
        from spendbus.stack.acls import create_acls
        from spendbus.stack.local import bootstrap_or_fail

        bootstrap = bootstrap_or_fail(settings)
        asyncio.run(create_acls(bootstrap, bindings, security=settings.kafka_security))
        click.echo(f"created {len(bindings)} bindings for {principal} ({role}) on {bootstrap}")
