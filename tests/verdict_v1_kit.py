"""Verdict v1 records as the released aggregator wrote them (before the forecast fields of
v2): the bytes ``aggregator.counting.verdict_codec.encode_verdict`` produced at commit 8385fb5 for
two counters folded from three events at 10:00, 10:10 and 10:20 UTC on 2026-12-03 ($2 and
150 tokens each), emitted at 10:21. Every compatibility test of Verdict v2 reads these."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

#: a day budget (acme-daily, org acme, $10, alert at 0.8): $6 spent, state ok
DAILY_V1: Final = bytes.fromhex(
    "c301d3a165a56f97418d2a31303a61636d652d6461696c792c343a61636d652c1461636d652d6461696c79"
    "066f7267020861636d650018643a323032362d31322d30330080f085da2c840706028090dfc04a0000001e"
    "6275646765745f6578636565646564028080adeaf1f0b00680d0c9a183eeb0060680ece5da83eeb006"
)
#: a rolling budget (acme-hourly, secret acme/sk-1, 1,000 tokens): 450 tokens spent
ROLLING_V1: Final = bytes.fromhex(
    "c301d3a165a56f97418d3a31313a61636d652d686f75726c792c343a61636d652c343a736b2d312c1661636d"
    "652d686f75726c790c736563726574040861636d6508736b2d310008723a31680080f085da2c840706000"
    "2d00f00001e6275646765745f65786365656465640080d0c9a183eeb0060680ece5da83eeb006"
)
DAILY_KEY: Final = "10:acme-daily,4:acme,"
ROLLING_KEY: Final = "11:acme-hourly,4:acme,4:sk-1,"
AS_OF: Final = datetime(2026, 12, 3, 10, 20, tzinfo=UTC)
EMITTED_AT: Final = datetime(2026, 12, 3, 10, 21, tzinfo=UTC)
