"""The console's HTML, written server side: a page frame, usage bars and the daily spend
chart as inline SVG (no script, no chart library to vendor, nothing fetched at run time;
the browser draws what the server measured). Every value put in a page is escaped here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any, Final

from schemas.money import format_usd

#: what the budget dialog tells its author (docs/overshoot.md, docs/design.md §7)
OVERSHOOT_NOTE: Final = (
    "Overshoot, measured (docs/overshoot.md): 50 streaming clients through 3 gateway "
    "replicas ended within 1 % of a $4 cap with the enforcer's replicas option set "
    "(−1.13 %), +10.6 % without it: calls already streaming when the cap is reached are "
    "finished, not cut. What may under-count: a stream whose provider never reports its "
    "usage (OpenAI Chat reports it only with stream_options.include_usage; a hang-up or an "
    "upstream cut) is charged the gateway's estimate, not the provider's bill."
)


def e(value: object) -> str:
    return escape("" if value is None else str(value), quote=True)


def usd(nanos: int | None) -> str:
    return "no limit" if nanos is None else format_usd(nanos, 2)


def when(iso: str | None) -> str:
    """``Thu 14:00`` (this week, UTC) or ``Thu 17 Dec 14:00``; '' for none."""
    if not iso:
        return ""
    moment = datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(UTC)
    if abs((moment - datetime.now(UTC)).days) < 6:
        return moment.strftime("%a %H:%M UTC")
    return moment.strftime("%a %d %b %H:%M UTC")


def page(title: str, body: str, *, who: str = "", csrf: str = "") -> str:
    nav = ""
    if who:
        nav = (
            '<nav><a href="/">Overview</a> <a href="/keys">Keys</a> <a href="/jobs">Jobs</a>'
            f'<span class="who">{e(who)}</span>'
            f'<form method="post" action="/logout" class="inline">{csrf_field(csrf)}'
            '<button type="submit" id="logout">Log out</button></form></nav>'
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)} · spendbus</title>"
        '<link rel="stylesheet" href="/static/console.css"></head>'
        f"<body>{nav}<main><h1>{e(title)}</h1>{body}</main></body></html>"
    )


def csrf_field(csrf: str) -> str:
    return f'<input type="hidden" name="csrf" value="{e(csrf)}">' if csrf else ""


def bar(spent: int, limit: int | None, state: str) -> str:
    """A usage bar: spent over the limit the enforcers check, coloured by state."""
    if not limit:
        return f'<div class="bar none" title="no USD limit">{e(usd(spent))}</div>'
    share = min(spent / limit, 1.0)
    return (
        f'<div class="bar s-{e(state)}" role="meter" aria-valuenow="{spent}" '
        f'aria-valuemax="{limit}" data-percent="{share * 100:.1f}">'
        # an SVG rect's width is an attribute: the CSP forbids inline styles
        '<svg class="fill" viewBox="0 0 1000 10" preserveAspectRatio="none" aria-hidden="true">'
        f'<rect width="{share * 1000:.0f}" height="10"></rect></svg>'
        f"<span>{e(usd(spent))} of {e(usd(limit))} ({share * 100:.0f} %)</span></div>"
    )


def daily_chart(days: Sequence[tuple[str, int]], width: int = 640, height: int = 160) -> str:
    """Spend per day as SVG bars, the day and amount in each bar's tooltip."""
    if not days:
        return '<p class="empty">No spend recorded in this period.</p>'
    top = max(cost for _, cost in days) or 1
    step = width / len(days)
    bars = []
    for i, (day, cost) in enumerate(days):
        h = max(cost / top * (height - 20), 1 if cost else 0)
        bars.append(
            f'<rect x="{i * step + 1:.1f}" y="{height - h:.1f}" width="{max(step - 2, 1):.1f}" '
            f'height="{h:.1f}"><title>{e(day)}: {e(usd(cost))}</title></rect>'
        )
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" preserveAspectRatio="none" role="img" '
        f'aria-label="spend per day, highest {e(usd(top))}">'
        f'<text x="2" y="12">{e(usd(top))}</text>{"".join(bars)}</svg>'
        f'<p class="axis">{e(days[0][0])} … {e(days[-1][0])}</p>'
    )


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], css: str = "") -> str:
    """A table; cells are HTML already (escape them with :func:`e`)."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{e(css)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def message(text: str, kind: str = "error") -> str:
    return f'<p class="{e(kind)}" role="alert">{e(text)}</p>'


def raise_rows(raises: Sequence[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            e(r["budget_id"]),
            e(r["scope"] or "every counter"),
            e(usd(r["raise_nanos"]) if r["raise_nanos"] else ""),
            e(when(r["until"])),
            e(r["status"]),
            e(r["reason"]),
        ]
        for r in raises
    ]
