"""Create ACL bindings (runtime.acls) through Kafka's admin API.

aiokafka 0.14's AIOKafkaAdminClient has no create_acls; it ships the CreateAcls request
(``aiokafka.protocol.admin.CreateAclsRequest``, one binding per request), which its public
``AIOKafkaClient`` sends to any broker (KRaft forwards it to the controller). That keeps
spendbus on one Kafka library and needs no Kafka CLI jars on an operator's machine.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka import errors as kafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.admin import CreateAclsRequest

from runtime.acls import ALLOW, AclBinding
from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.errors import ConfigError


async def create_acls(
    bootstrap: str, bindings: Sequence[AclBinding], *, security: KafkaSecurity = PLAINTEXT
) -> None:
    """Create every binding (an existing one is kept as it is: CreateAcls is idempotent).

    ConfigError naming the first binding the cluster refused, and why (no authorizer, a
    principal that may not alter ACLs, ...)."""
    client = AIOKafkaClient(
        bootstrap_servers=bootstrap, client_id="spendbus-acls", **security.client_kwargs()
    )
    await client.bootstrap()
    try:
        for binding in bindings:
            request = CreateAclsRequest(
                int(binding.resource_type),
                binding.resource_name,
                int(binding.pattern_type),
                binding.principal,
                binding.host,
                int(binding.operation),
                ALLOW,
            )
            response = await client.send(client.get_random_node(), request)
            for error_code, error_message in response.creation_responses:
                if error_code != 0:
                    kind = kafka_errors.for_code(error_code).__name__
                    raise ConfigError(
                        f"Kafka {bootstrap} refused {binding.describe()}: {kind}"
                        f"{f' ({error_message})' if error_message else ''}"
                    )
    finally:
        await client.close()
