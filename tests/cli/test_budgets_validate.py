"""`spendbus budgets validate FILE` (issue 37, item 4): a budget file checked for CI with no
broker; every error named (file, budget, field), not only the first; `budgets apply` still
stops at the first with the same message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from schemas.budgets import budgets_from_yaml, parse_budgets_yaml
from schemas.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

#: three budgets with four mistakes between them, and one valid budget
BROKEN: list[dict[str, object]] = [
    {"id": "ok", "scope": "org", "window": "month", "limit_usd": "50"},
    {"id": "bad-scope", "scope": "planet", "window": "fortnight", "limit_usd": "5"},
    {"id": "bad-money", "scope": "org", "window": "month", "limit_usd": "0"},
    {"id": "ok", "scope": "secret", "window": "day", "limit_requests": 10},
]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    # a real process: what CI runs, with no broker address anywhere in its environment
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": "/nonexistent"}
    return subprocess.run(
        [sys.executable, "-m", "spendbus", "budgets", "validate", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_every_error_is_named_and_the_exit_is_1(tmp_path: Path) -> None:
    path = tmp_path / "budgets.yaml"
    path.write_text(yaml.safe_dump(BROKEN))
    done = run(str(path))
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: {path}: budget 'bad-scope': field 'scope': must be one of secret, org, "
        "project, grant, group, user, session or tag:<name>, got 'planet'",
        f"error: {path}: budget 'bad-scope': field 'window': "
        + errors[1].split("field 'window': ", 1)[1],
        f"error: {path}: budget 'bad-money': field 'limit_usd': must be > 0",
        f"error: {path}: budget 'ok': field 'id': defined twice",
    ]
    assert "fortnight" in errors[1]
    assert done.stderr.splitlines()[-1] == f"{path}: 4 errors"


def test_a_valid_file_exits_0_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "budgets.yaml"
    path.write_text(yaml.safe_dump([BROKEN[0], {**BROKEN[3], "id": "keys", "action": "warn"}]))
    done = run(str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{path}: 2 budgets valid (1 enforce, 1 warn)\n"
    assert done.stderr == ""


def test_the_shipped_demo_budgets_are_valid() -> None:
    path = ROOT / "spendbus" / "demo_data" / "budgets.yaml"
    done = run(str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{path}: ") and " valid (" in done.stdout


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("- id: [unclosed\n", "budgets.yaml"),  # not YAML
        ("id: x\nscope: org\n", "expected a list of budgets"),
        ("- just a string\n", "budget '#1': each budget must be a mapping"),
    ],
)
def test_a_file_that_is_not_a_budget_list_exits_1(tmp_path: Path, content: str, named: str) -> None:
    path = tmp_path / "budgets.yaml"
    path.write_text(content)
    done = run(str(path))
    assert done.returncode == 1
    assert named in done.stderr and str(path) in done.stderr


def test_a_missing_file_exits_1_naming_it(tmp_path: Path) -> None:
    done = run(str(tmp_path / "absent.yaml"))
    assert done.returncode == 1
    assert "absent.yaml" in done.stderr


def test_apply_keeps_stopping_at_the_first_error_with_its_message() -> None:
    _, errors = parse_budgets_yaml(BROKEN, source="f.yaml")
    assert len(errors) == 4
    with pytest.raises(ConfigError) as caught:
        budgets_from_yaml(BROKEN, source="f.yaml")
    assert str(caught.value) == errors[0]
    assert str(caught.value).startswith("f.yaml: budget 'bad-scope': field 'scope': ")


def test_a_bad_amount_is_named_beside_the_other_fields_errors() -> None:
    # limit_usd is read after the other fields validate: it must still be listed with them
    item = {"id": "b", "scope": "nowhere", "window": "month", "limit_usd": "ten dollars"}
    _, errors = parse_budgets_yaml([item], source="f.yaml")
    assert [e.split(": field ")[1].split(":")[0] for e in errors] == ["'scope'", "'limit_usd'"]


def test_a_job_budget_lists_each_of_its_errors() -> None:
    item = {"id": "j", "job_budget": {"requests_per_job": 0, "colour": "red"}}
    _, errors = parse_budgets_yaml([item], source="f.yaml")
    assert len(errors) == 2
    assert any("field 'job_budget.requests_per_job'" in e for e in errors)
    assert any("field 'job_budget.colour'" in e for e in errors)
