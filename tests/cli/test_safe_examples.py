"""Examples a user copies are safe as shipped (issue 35): the README's budgets cap what
their text says, the keys files ship no usable clear key, and a new key never lands in a
file others can read."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from pathlib import Path

import yaml
from click.testing import CliRunner

from spendbus.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def _readme_budgets() -> list[dict[str, object]]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"Budgets \(YAML.*?```yaml\n(.*?)```", text, re.S)
    assert block is not None
    budgets: list[dict[str, object]] = yaml.safe_load(block.group(1))
    return budgets


def test_the_readmes_acme_budgets_cap_acme_only() -> None:
    from schemas.budgets import budgets_from_yaml

    shown = _readme_budgets()
    parsed = budgets_from_yaml(shown, source="README.md")
    acme = [b for b in parsed if b.budget_id.startswith("acme-")]
    assert {b.budget_id for b in acme} == {"acme-monthly", "acme-cycle"}
    assert all(b.match.get("org_id") == ("acme",) for b in acme), [
        (b.budget_id, b.match) for b in acme
    ]


def test_the_shipped_keys_file_has_no_clear_key() -> None:
    data = yaml.safe_load((ROOT / "infra" / "gateway" / "keys.example.yaml").read_text())
    assert data["keys"] and all("key" not in entry for entry in data["keys"])


def test_keys_new_out_writes_a_private_file_and_never_overwrites(tmp_path: Path) -> None:
    env = {"SPENDBUS_HOME": str(tmp_path / "home")}
    out = tmp_path / "alice.key"
    result = CliRunner().invoke(cli, ["keys", "new", "--out", str(out)], env=env)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    key = out.read_text().strip()
    assert key.startswith("sb-") and key not in result.stdout
    assert re.fullmatch(r"[0-9a-f]{64}", result.stdout.strip())
    again = CliRunner().invoke(cli, ["keys", "new", "--out", str(out)], env=env)
    assert again.exit_code != 0 and "exists" in again.output
    assert out.read_text().strip() == key


def test_keys_new_redirected_to_a_file_leaves_it_private(tmp_path: Path) -> None:
    """`spendbus keys new > alice.key`: the shell creates the file 0644 (umask 022)."""
    out = tmp_path / "alice.key"
    out.touch(mode=0o644)
    out.chmod(0o644)
    with out.open("w") as stdout:
        done = subprocess.run(
            [sys.executable, "-m", "spendbus", "keys", "new"],
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            env={"SPENDBUS_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"},
            cwd=ROOT,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert out.read_text().startswith("sb-") and "key_hmac" in done.stderr
