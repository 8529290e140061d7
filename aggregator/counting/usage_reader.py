"""The UsageEvent body reader, generated from its schema by ``python -m schemas.readergen``: do not edit.

Timestamps are integer microseconds."""

from datetime import UTC, datetime, timedelta
from typing import Any, Final


class NotPlain(Exception):
    """Input this reader does not take: the codec decides."""


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The zig-zag decoded long at ``pos`` (a multi-byte varint) and the offset past it."""
    z = 0
    shift = 0
    while True:
        b = data[pos]  # IndexError past the end: the codec decides
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise NotPlain
    if z >= 1 << 64:
        raise NotPlain
    return (z >> 1) ^ -(z & 1), pos

_k88: Final = ('reported', 'estimated', 'none')
_k98: Final = ('allowed', 'refused', 'failed_open', 'failed_closed')


def read(data: bytes, pos: int) -> tuple[dict[str, Any], int]:
    size = len(data)
    f1: str
    b4 = data[pos]
    if b4 < 0x80 and not b4 & 1:
        n2 = b4 >> 1
        pos += 1
    else:
        n2, pos = _read_varint(data, pos)
        if n2 < 0: raise NotPlain
    e3 = pos + n2
    if e3 > size: raise NotPlain
    f1 = data[pos:e3].decode()
    pos = e3
    f5: int
    b6 = data[pos]
    if b6 < 0x80:
        f5 = (b6 >> 1) ^ -(b6 & 1)
        pos += 1
    else:
        f5, pos = _read_varint(data, pos)
    f7: str
    b10 = data[pos]
    if b10 < 0x80 and not b10 & 1:
        n8 = b10 >> 1
        pos += 1
    else:
        n8, pos = _read_varint(data, pos)
        if n8 < 0: raise NotPlain
    e9 = pos + n8
    if e9 > size: raise NotPlain
    f7 = data[pos:e9].decode()
    pos = e9
    f11: str
    b14 = data[pos]
    if b14 < 0x80 and not b14 & 1:
        n12 = b14 >> 1
        pos += 1
    else:
        n12, pos = _read_varint(data, pos)
        if n12 < 0: raise NotPlain
    e13 = pos + n12
    if e13 > size: raise NotPlain
    f11 = data[pos:e13].decode()
    pos = e13
    f15: str
    b18 = data[pos]
    if b18 < 0x80 and not b18 & 1:
        n16 = b18 >> 1
        pos += 1
    else:
        n16, pos = _read_varint(data, pos)
        if n16 < 0: raise NotPlain
    e17 = pos + n16
    if e17 > size: raise NotPlain
    f15 = data[pos:e17].decode()
    pos = e17
    f19: str
    b22 = data[pos]
    if b22 < 0x80 and not b22 & 1:
        n20 = b22 >> 1
        pos += 1
    else:
        n20, pos = _read_varint(data, pos)
        if n20 < 0: raise NotPlain
    e21 = pos + n20
    if e21 > size: raise NotPlain
    f19 = data[pos:e21].decode()
    pos = e21
    f23: str
    b26 = data[pos]
    if b26 < 0x80 and not b26 & 1:
        n24 = b26 >> 1
        pos += 1
    else:
        n24, pos = _read_varint(data, pos)
        if n24 < 0: raise NotPlain
    e25 = pos + n24
    if e25 > size: raise NotPlain
    f23 = data[pos:e25].decode()
    pos = e25
    f27: str | None
    b28 = data[pos]
    pos += 1
    if b28 == 0: f27 = None
    elif b28 == 2:
        u29: str
        b32 = data[pos]
        if b32 < 0x80 and not b32 & 1:
            n30 = b32 >> 1
            pos += 1
        else:
            n30, pos = _read_varint(data, pos)
            if n30 < 0: raise NotPlain
        e31 = pos + n30
        if e31 > size: raise NotPlain
        u29 = data[pos:e31].decode()
        pos = e31
        f27 = u29
    else: raise NotPlain
    f33: str | None
    b34 = data[pos]
    pos += 1
    if b34 == 0: f33 = None
    elif b34 == 2:
        u35: str
        b38 = data[pos]
        if b38 < 0x80 and not b38 & 1:
            n36 = b38 >> 1
            pos += 1
        else:
            n36, pos = _read_varint(data, pos)
            if n36 < 0: raise NotPlain
        e37 = pos + n36
        if e37 > size: raise NotPlain
        u35 = data[pos:e37].decode()
        pos = e37
        f33 = u35
    else: raise NotPlain
    f39: str | None
    b40 = data[pos]
    pos += 1
    if b40 == 0: f39 = None
    elif b40 == 2:
        u41: str
        b44 = data[pos]
        if b44 < 0x80 and not b44 & 1:
            n42 = b44 >> 1
            pos += 1
        else:
            n42, pos = _read_varint(data, pos)
            if n42 < 0: raise NotPlain
        e43 = pos + n42
        if e43 > size: raise NotPlain
        u41 = data[pos:e43].decode()
        pos = e43
        f39 = u41
    else: raise NotPlain
    f45: str | None
    b46 = data[pos]
    pos += 1
    if b46 == 0: f45 = None
    elif b46 == 2:
        u47: str
        b50 = data[pos]
        if b50 < 0x80 and not b50 & 1:
            n48 = b50 >> 1
            pos += 1
        else:
            n48, pos = _read_varint(data, pos)
            if n48 < 0: raise NotPlain
        e49 = pos + n48
        if e49 > size: raise NotPlain
        u47 = data[pos:e49].decode()
        pos = e49
        f45 = u47
    else: raise NotPlain
    f51: list[str]
    f51 = []
    while True:
        b54 = data[pos]
        if b54 < 0x80 and not b54 & 1:
            c52 = b54 >> 1
            pos += 1
        else:
            c52, pos = _read_varint(data, pos)
            if c52 < 0: raise NotPlain
        if not c52: break
        for _ in range(c52):
            v53: str
            b57 = data[pos]
            if b57 < 0x80 and not b57 & 1:
                n55 = b57 >> 1
                pos += 1
            else:
                n55, pos = _read_varint(data, pos)
                if n55 < 0: raise NotPlain
            e56 = pos + n55
            if e56 > size: raise NotPlain
            v53 = data[pos:e56].decode()
            pos = e56
            f51.append(v53)
    f58: str | None
    b59 = data[pos]
    pos += 1
    if b59 == 0: f58 = None
    elif b59 == 2:
        u60: str
        b63 = data[pos]
        if b63 < 0x80 and not b63 & 1:
            n61 = b63 >> 1
            pos += 1
        else:
            n61, pos = _read_varint(data, pos)
            if n61 < 0: raise NotPlain
        e62 = pos + n61
        if e62 > size: raise NotPlain
        u60 = data[pos:e62].decode()
        pos = e62
        f58 = u60
    else: raise NotPlain
    f64: dict[str, str]
    f64 = {}
    while True:
        b67 = data[pos]
        if b67 < 0x80 and not b67 & 1:
            c65 = b67 >> 1
            pos += 1
        else:
            c65, pos = _read_varint(data, pos)
            if c65 < 0: raise NotPlain
        if not c65: break
        for _ in range(c65):
            v66: str
            b71 = data[pos]
            if b71 < 0x80 and not b71 & 1:
                n69 = b71 >> 1
                pos += 1
            else:
                n69, pos = _read_varint(data, pos)
                if n69 < 0: raise NotPlain
            e70 = pos + n69
            if e70 > size: raise NotPlain
            m68 = data[pos:e70].decode()
            pos = e70
            b74 = data[pos]
            if b74 < 0x80 and not b74 & 1:
                n72 = b74 >> 1
                pos += 1
            else:
                n72, pos = _read_varint(data, pos)
                if n72 < 0: raise NotPlain
            e73 = pos + n72
            if e73 > size: raise NotPlain
            v66 = data[pos:e73].decode()
            pos = e73
            f64[m68] = v66
    f75: int
    b76 = data[pos]
    if b76 < 0x80:
        f75 = (b76 >> 1) ^ -(b76 & 1)
        pos += 1
    else:
        f75, pos = _read_varint(data, pos)
    f77: int
    b78 = data[pos]
    if b78 < 0x80:
        f77 = (b78 >> 1) ^ -(b78 & 1)
        pos += 1
    else:
        f77, pos = _read_varint(data, pos)
    f79: int
    b80 = data[pos]
    if b80 < 0x80:
        f79 = (b80 >> 1) ^ -(b80 & 1)
        pos += 1
    else:
        f79, pos = _read_varint(data, pos)
    f81: int
    b82 = data[pos]
    if b82 < 0x80:
        f81 = (b82 >> 1) ^ -(b82 & 1)
        pos += 1
    else:
        f81, pos = _read_varint(data, pos)
    f83: int
    b84 = data[pos]
    if b84 < 0x80:
        f83 = (b84 >> 1) ^ -(b84 & 1)
        pos += 1
    else:
        f83, pos = _read_varint(data, pos)
    f85: int
    b86 = data[pos]
    if b86 < 0x80:
        f85 = (b86 >> 1) ^ -(b86 & 1)
        pos += 1
    else:
        f85, pos = _read_varint(data, pos)
    f87: str
    b90 = data[pos]
    if b90 < 0x80:
        i89 = (b90 >> 1) ^ -(b90 & 1)
        pos += 1
    else:
        i89, pos = _read_varint(data, pos)
    if not 0 <= i89 < 3: raise NotPlain
    f87 = _k88[i89]
    f91: str | None
    b92 = data[pos]
    pos += 1
    if b92 == 0: f91 = None
    elif b92 == 2:
        u93: str
        b96 = data[pos]
        if b96 < 0x80 and not b96 & 1:
            n94 = b96 >> 1
            pos += 1
        else:
            n94, pos = _read_varint(data, pos)
            if n94 < 0: raise NotPlain
        e95 = pos + n94
        if e95 > size: raise NotPlain
        u93 = data[pos:e95].decode()
        pos = e95
        f91 = u93
    else: raise NotPlain
    f97: str
    b100 = data[pos]
    if b100 < 0x80:
        i99 = (b100 >> 1) ^ -(b100 & 1)
        pos += 1
    else:
        i99, pos = _read_varint(data, pos)
    if not 0 <= i99 < 4: raise NotPlain
    f97 = _k98[i99]
    f101: str
    b104 = data[pos]
    if b104 < 0x80 and not b104 & 1:
        n102 = b104 >> 1
        pos += 1
    else:
        n102, pos = _read_varint(data, pos)
        if n102 < 0: raise NotPlain
    e103 = pos + n102
    if e103 > size: raise NotPlain
    f101 = data[pos:e103].decode()
    pos = e103
    f105: str | None
    b106 = data[pos]
    pos += 1
    if b106 == 0: f105 = None
    elif b106 == 2:
        u107: str
        b110 = data[pos]
        if b110 < 0x80 and not b110 & 1:
            n108 = b110 >> 1
            pos += 1
        else:
            n108, pos = _read_varint(data, pos)
            if n108 < 0: raise NotPlain
        e109 = pos + n108
        if e109 > size: raise NotPlain
        u107 = data[pos:e109].decode()
        pos = e109
        f105 = u107
    else: raise NotPlain
    f111: int
    b112 = data[pos]
    if b112 < 0x80:
        f111 = (b112 >> 1) ^ -(b112 & 1)
        pos += 1
    else:
        f111, pos = _read_varint(data, pos)
    f113: bool
    b114 = data[pos]
    pos += 1
    if b114 == 1: f113 = True
    elif b114 == 0: f113 = False
    else: raise NotPlain
    f115: str
    b118 = data[pos]
    if b118 < 0x80 and not b118 & 1:
        n116 = b118 >> 1
        pos += 1
    else:
        n116, pos = _read_varint(data, pos)
        if n116 < 0: raise NotPlain
    e117 = pos + n116
    if e117 > size: raise NotPlain
    f115 = data[pos:e117].decode()
    pos = e117
    f119: str | None
    b120 = data[pos]
    pos += 1
    if b120 == 0: f119 = None
    elif b120 == 2:
        u121: str
        b124 = data[pos]
        if b124 < 0x80 and not b124 & 1:
            n122 = b124 >> 1
            pos += 1
        else:
            n122, pos = _read_varint(data, pos)
            if n122 < 0: raise NotPlain
        e123 = pos + n122
        if e123 > size: raise NotPlain
        u121 = data[pos:e123].decode()
        pos = e123
        f119 = u121
    else: raise NotPlain
    f125: int | None
    b126 = data[pos]
    pos += 1
    if b126 == 0: f125 = None
    elif b126 == 2:
        u127: int
        b128 = data[pos]
        if b128 < 0x80:
            u127 = (b128 >> 1) ^ -(b128 & 1)
            pos += 1
        else:
            u127, pos = _read_varint(data, pos)
        f125 = u127
    else: raise NotPlain
    f129: dict[str, int]
    f129 = {}
    while True:
        b132 = data[pos]
        if b132 < 0x80 and not b132 & 1:
            c130 = b132 >> 1
            pos += 1
        else:
            c130, pos = _read_varint(data, pos)
            if c130 < 0: raise NotPlain
        if not c130: break
        for _ in range(c130):
            v131: int
            b136 = data[pos]
            if b136 < 0x80 and not b136 & 1:
                n134 = b136 >> 1
                pos += 1
            else:
                n134, pos = _read_varint(data, pos)
                if n134 < 0: raise NotPlain
            e135 = pos + n134
            if e135 > size: raise NotPlain
            m133 = data[pos:e135].decode()
            pos = e135
            b137 = data[pos]
            if b137 < 0x80:
                v131 = (b137 >> 1) ^ -(b137 & 1)
                pos += 1
            else:
                v131, pos = _read_varint(data, pos)
            f129[m133] = v131
    f138: str | None
    b139 = data[pos]
    pos += 1
    if b139 == 0: f138 = None
    elif b139 == 2:
        u140: str
        b143 = data[pos]
        if b143 < 0x80 and not b143 & 1:
            n141 = b143 >> 1
            pos += 1
        else:
            n141, pos = _read_varint(data, pos)
            if n141 < 0: raise NotPlain
        e142 = pos + n141
        if e142 > size: raise NotPlain
        u140 = data[pos:e142].decode()
        pos = e142
        f138 = u140
    else: raise NotPlain
    f144: str | None
    b145 = data[pos]
    pos += 1
    if b145 == 0: f144 = None
    elif b145 == 2:
        u146: str
        b149 = data[pos]
        if b149 < 0x80 and not b149 & 1:
            n147 = b149 >> 1
            pos += 1
        else:
            n147, pos = _read_varint(data, pos)
            if n147 < 0: raise NotPlain
        e148 = pos + n147
        if e148 > size: raise NotPlain
        u146 = data[pos:e148].decode()
        pos = e148
        f144 = u146
    else: raise NotPlain
    return {'event_id': f1, 'occurred_at': f5, 'provider': f7, 'api': f11, 'model': f15, 'secret_id': f19, 'org_id': f23, 'project_id': f27, 'grant_id': f33, 'permission_id': f39, 'user_id': f45, 'groups': f51, 'session_id': f58, 'tags': f64, 'input_tokens': f75, 'cache_read_tokens': f77, 'cache_write_tokens': f79, 'cache_write_1h_tokens': f81, 'output_tokens': f83, 'reasoning_tokens': f85, 'usage_source': f87, 'estimate_reason': f91, 'outcome': f97, 'decision': f101, 'decision_budget_id': f105, 'status_code': f111, 'stream': f113, 'gateway_id': f115, 'request_id': f119, 'latency_ms': f125, 'units': f129, 'service_tier': f138, 'charge_of': f144}, pos


#: the message header (writer schema) this reader reads
HEADER: Final = b'\xc3\x01\x8e\xf2\xd2l\x9a\xf4o&'
