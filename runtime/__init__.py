"""The runtime kit every room shares: how a process talks to Kafka and keeps its edges.

``schemas/`` is the contract (what two stages must agree on); this package is the I/O
they have in common: Kafka clients' security and preflight (``kafka.py``), how to reach a ClickHouse
server over HTTPS (``clickhouse_access.py``), topics read to
their end (``topic_reader.py``) or followed live (``topic_follower.py``), replication plans (``replication.py``), the ACLs of each
role (``acls.py``), loopback checks (``net.py``), quiet and redacted HTTP logs
(``http_log.py``, ``log_redaction.py``), pipelined requests after a half-close (``half_close.py``), secret
files kept private (``private_files.py``) and faces that load on first use
(``faces.py``). It imports ``schemas/`` and libraries, never a stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime.faces import lazy_names

if TYPE_CHECKING:
    from runtime.acls import ROLES, AclBinding, role_bindings
    from runtime.clickhouse_access import DEFAULT_ACCESS, ClickHouseAccess, redact_dsn
    from runtime.compacted import CompactedView, publish, publish_with
    from runtime.half_close import AnswerAfterHalfClose
    from runtime.http_log import expose_malformed_requests
    from runtime.kafka import (
        PLAINTEXT,
        KafkaSecurity,
        committed_offsets,
        preflight,
        topic_partitions,
    )
    from runtime.log_redaction import install_log_redaction, redact
    from runtime.net import LOOPBACK_HOSTS, is_loopback
    from runtime.private_files import PRIVATE_UMASK, check_secret_file, secret_file_problem
    from runtime.replication import (
        FOLLOW_CLUSTER,
        ReplicationPlan,
        ReplicationPolicy,
        plan_for,
        replication_problems,
        resolve_plan,
    )
    from runtime.topic_follower import TopicFollower
    from runtime.topic_reader import (
        TopicReader,
        TopicReadStalled,
        read_latest_values,
        read_until,
        start_at_beginning,
    )

#: each public name and the module that defines it
_HOMES: dict[str, str] = {
    "ClickHouseAccess": "runtime.clickhouse_access",
    "DEFAULT_ACCESS": "runtime.clickhouse_access",
    "redact_dsn": "runtime.clickhouse_access",
    "AclBinding": "runtime.acls",
    "CompactedView": "runtime.compacted",
    "publish": "runtime.compacted",
    "publish_with": "runtime.compacted",
    "AnswerAfterHalfClose": "runtime.half_close",
    "FOLLOW_CLUSTER": "runtime.replication",
    "KafkaSecurity": "runtime.kafka",
    "committed_offsets": "runtime.kafka",
    "LOOPBACK_HOSTS": "runtime.net",
    "PLAINTEXT": "runtime.kafka",
    "PRIVATE_UMASK": "runtime.private_files",
    "ROLES": "runtime.acls",
    "ReplicationPlan": "runtime.replication",
    "ReplicationPolicy": "runtime.replication",
    "TopicFollower": "runtime.topic_follower",
    "TopicReadStalled": "runtime.topic_reader",
    "TopicReader": "runtime.topic_reader",
    "check_secret_file": "runtime.private_files",
    "expose_malformed_requests": "runtime.http_log",
    "install_log_redaction": "runtime.log_redaction",
    "is_loopback": "runtime.net",
    "lazy_names": "runtime.faces",
    "plan_for": "runtime.replication",
    "preflight": "runtime.kafka",
    "read_latest_values": "runtime.topic_reader",
    "read_until": "runtime.topic_reader",
    "redact": "runtime.log_redaction",
    "replication_problems": "runtime.replication",
    "resolve_plan": "runtime.replication",
    "role_bindings": "runtime.acls",
    "secret_file_problem": "runtime.private_files",
    "start_at_beginning": "runtime.topic_reader",
    "topic_partitions": "runtime.kafka",
}

__all__ = [
    "DEFAULT_ACCESS",
    "FOLLOW_CLUSTER",
    "LOOPBACK_HOSTS",
    "PLAINTEXT",
    "PRIVATE_UMASK",
    "ROLES",
    "AclBinding",
    "AnswerAfterHalfClose",
    "ClickHouseAccess",
    "CompactedView",
    "KafkaSecurity",
    "ReplicationPlan",
    "ReplicationPolicy",
    "TopicFollower",
    "TopicReadStalled",
    "TopicReader",
    "check_secret_file",
    "committed_offsets",
    "expose_malformed_requests",
    "install_log_redaction",
    "is_loopback",
    "lazy_names",
    "plan_for",
    "preflight",
    "publish",
    "publish_with",
    "read_latest_values",
    "read_until",
    "redact",
    "redact_dsn",
    "replication_problems",
    "resolve_plan",
    "role_bindings",
    "secret_file_problem",
    "start_at_beginning",
    "topic_partitions",
]

__getattr__, __dir__ = lazy_names(__name__, _HOMES)
