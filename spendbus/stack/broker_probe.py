"""Free loopback ports and the readiness probe: two raw Kafka protocol requests
(ApiVersions, Metadata) over a plain socket, so no client library is needed."""

from __future__ import annotations

import socket
import struct

__all__ = ["broker_ready", "free_port", "free_ports"]

# --------------------------------------------------------------------------------------------
# Ports and the readiness probe
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    # Hold all sockets open until every port is chosen, so the n ports are distinct.
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


_API_METADATA = 3
_API_VERSIONS = 18
# Metadata v4..v8 share one request layout (v8 adds two booleans we do not send). Kafka 4.0
# removed v0-v3 (KIP-896), so v4 is the oldest that any 4.x broker still answers.
_METADATA_VERSION = 4


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        buf += chunk
    return bytes(buf)


def _request(sock: socket.socket, api_key: int, version: int, corr: int, body: bytes) -> bytes:
    """Send one request with a v1 header (non-flexible) and return the response body."""
    client_id = b"spendbus-probe"
    header = struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    data = _recv_exact(sock, size)
    (got_corr,) = struct.unpack_from(">i", data, 0)
    if got_corr != corr:
        raise ConnectionError(f"correlation id mismatch ({got_corr} != {corr})")
    return data[4:]  # response header v0 is only the correlation id


def broker_ready(host: str, port: int, timeout: float = 2.0, brokers: int = 1) -> bool:
    """True when the broker at host:port answers ApiVersions and lists at least ``brokers``
    brokers (a node of a :class:`~spendbus.stack.cluster.LocalCluster` waits for all of them).

    A KRaft broker opens its listener before it has registered with the controller and been
    unfenced; Metadata lists only unfenced brokers, so a non-empty broker list means topics can
    be created and produced to. Works for any Kafka >= 4.0 (and 3.x, which still has v4).
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            body = _request(sock, _API_VERSIONS, 0, 1, b"")
            error_code, count = struct.unpack_from(">hi", body, 0)
            if error_code != 0:
                return False
            ranges = {
                key: (lo, hi)
                for key, lo, hi in (
                    struct.unpack_from(">hhh", body, 6 + 6 * i) for i in range(count)
                )
            }
            lo, hi = ranges.get(_API_METADATA, (0, -1))
            if not lo <= _METADATA_VERSION <= hi:
                # A future broker without Metadata v4: answering ApiVersions is the best we know.
                return True
            # topics = [] (brokers only), allow_auto_topic_creation = false
            body = _request(sock, _API_METADATA, _METADATA_VERSION, 2, struct.pack(">ib", 0, 0))
            _throttle_ms, n_brokers = struct.unpack_from(">ii", body, 0)
            return bool(n_brokers >= max(1, brokers))
    except (OSError, ConnectionError, struct.error):
        return False
