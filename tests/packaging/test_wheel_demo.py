"""The package as a user installs it: an sdist, a wheel built from that sdist (as pip
builds one from PyPI: the hot modules compiled, no repository around), a clean venv, and
``spendbus demo`` run from an empty folder. Everything a command needs at run time (the
ClickHouse DDL, the broker's pom, the shipped prices, the demo budgets) must come from
the installed package: the demo fails otherwise, and it checks its own results. The
contract's files for other languages (the standalone .avsc, the ingest body's JSON
Schema) must be in it as well."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from spendbus.demo_reconcile import RESULT_LINE
from tests.native_kit import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

#: what the demo's end-to-end table prints for each passed check
DEMO_CHECKS = (
    "events in ClickHouse = unique events sent",
    "ClickHouse total = exact sum",
    "duplicate publishes charged once",
    "refused with 402 budget_exceeded",
    RESULT_LINE,  # the reconciliation against the fake providers' bill: nothing unexplained
)


def clean_environment() -> dict[str, str]:
    """The caller's environment without anything that points at this checkout or at the
    test session's broker and store (HOME stays: the broker jars are cached under it)."""
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "KAFKA_BOOTSTRAP", "CLICKHOUSE_DSN")
    return {
        k: v
        for k, v in os.environ.items()
        if k not in dropped and not k.startswith(("SPENDBUS_", "KAFKA_"))
    }


def run(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        command,
        cwd=cwd,
        env=clean_environment(),
        stdin=subprocess.DEVNULL,  # off a terminal: the demo serves no console, it ends
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (
        f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


def test_a_wheel_built_from_the_sdist_runs_the_demo_from_an_empty_folder(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # `build` makes the sdist, then the wheel from the unpacked sdist: what the sdist
    # leaves out, the wheel cannot carry
    run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], tmp_path, 900)
    wheels = list(dist.glob("spendbus-*.whl"))
    assert len(wheels) == 1 and list(dist.glob("spendbus-*.tar.gz")), sorted(dist.iterdir())

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    run([str(python), "-m", "pip", "install", "-q", str(wheels[0])], tmp_path, 900)

    empty = tmp_path / "empty"
    empty.mkdir()
    located = run(
        [
            str(python),
            "-c",
            # the console reads its stylesheet as it is imported: it must ship
            "import admin.console, spendbus, aggregator.sink.store as s; "
            "print(spendbus.__file__); print(s.DDL_DIR)",
        ],
        empty,
        60,
    ).stdout.split()
    assert all(str(env_dir) in path and str(ROOT) not in path for path in located), located
    # the contract files another language reads ship too: the standalone Avro schemas and
    # the JSON Schema that `ingest serve` answers, byte for byte the checkout's
    shipped = run(
        [
            str(python),
            "-c",
            "import sys; from importlib import resources; "
            "from schemas.usage_json_schema import shipped_schema_bytes; "
            "folder = resources.files('schemas') / 'avro' / 'standalone'; "
            "print(sorted(p.name for p in folder.iterdir())); "
            "sys.stdout.write(shipped_schema_bytes().decode())",
        ],
        empty,
        60,
    ).stdout
    listing, _, json_schema = shipped.partition("\n")
    standalone = sorted(p.name for p in (ROOT / "schemas" / "avro" / "standalone").glob("*.avsc"))
    assert listing == str(standalone)
    assert json_schema == (ROOT / "schemas" / "json" / "usage_ingest_body.schema.json").read_text()

    demo = run([str(env_dir / "bin" / "spendbus"), "demo"], empty, 900)
    for check in DEMO_CHECKS:
        line = next((line for line in demo.stdout.splitlines() if check in line), "")
        assert line.rstrip(" │").endswith("pass"), f"{check!r}: {line!r}"
    # off a terminal no console is served (no login minted): the address, and that it stops
    assert "the demo stack stops now" in demo.stdout and "sbadm_" not in demo.stdout
