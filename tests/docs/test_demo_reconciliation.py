"""The README's report of the demo's traffic is the one `spendbus demo` prints when its
reconciliation passes: every day of every provider the demo reconciles, no residual in
tokens or money, every delta under a cause the reconciliation names, and the demo's
passing result line last (the demo itself exits non-zero otherwise, and
tests/packaging/test_wheel_demo.py holds it to that line)."""

from __future__ import annotations

from pathlib import Path

from reconcile import CAUSES
from spendbus.demo_reconcile import REPORTED, RESULT_LINE

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "**The demo's traffic, reconciled.**"


def demo_report() -> list[str]:
    section = README.read_text().split(HEADING, 1)[1]
    return section.split("```\n", 2)[1].splitlines()


def test_the_readme_shows_the_demos_reconciliation_with_no_residual() -> None:
    lines = demo_report()
    days = lines[1 : lines.index("")]
    assert lines[0].split() == [
        "provider",
        "day",
        "billed",
        "tok",
        "metered",
        "tok",
        "residual",
        "explained",
    ]
    assert sorted(line.split()[0] for line in days) == sorted(REPORTED)
    for line in days:
        _, _, billed, metered, residual, *explained = line.split()
        assert residual == "0", line
        assert int(billed) > 0 and int(metered) > 0, line
        assert all(name in CAUSES for name in explained[::2]), line
    costs = lines[lines.index(next(x for x in lines if x.startswith("cost "))) + 1 :]
    cost_days = costs[: costs.index("")]
    assert sorted(line.split()[0] for line in cost_days) == sorted(REPORTED)
    for line in cost_days:
        assert line.split()[4] == "$0.000000000", line
    flagged = [line for line in lines if " <- " in line]
    assert flagged, "the demo's estimated calls show as deltas"
    for line in flagged:
        causes = line.split(" <- ", 1)[1].split(" (", 1)[0].split(", ")
        assert causes and all(c in CAUSES and c != "unexplained" for c in causes), line
    assert lines[-1] == f"{RESULT_LINE} 0 tokens, $0.000000000: pass"
