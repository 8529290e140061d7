"""Fetching the local broker: its jars from Maven Central (`spendbus/stack/broker/pom.xml`),
once, into a cache folder shared by every checkout; standard library only."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from spendbus.stack.broker_process import BrokerStartError, file_lock

__all__ = ["DEFAULT_INFRA_DIR", "BrokerFetchError", "ensure_broker_jars", "kafka_version"]

#: Where pom.xml and log4j2.yaml live: package data beside this module, so an installed
#: wheel fetches and starts the broker as a checkout does.
DEFAULT_INFRA_DIR = Path(__file__).resolve().parent / "broker"

#: Written into the libs folder once every jar has been copied; holds the pom's hash and the jar
#: count, so an interrupted fetch, a deleted jar or an edited pom all trigger a new fetch.
_MARKER = ".spendbus-complete.json"

_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


class BrokerFetchError(BrokerStartError):
    """Maven could not fetch the broker jars (a start cannot happen without them)."""


# --------------------------------------------------------------------------------------------
# Fetching the broker
# --------------------------------------------------------------------------------------------


def kafka_version(infra_dir: Path = DEFAULT_INFRA_DIR) -> str:
    """The Kafka version pinned in ``infra_dir/pom.xml`` (property ``kafka.version``).

    The pom is the single place the version is written; the cache folder is named after it.
    """
    pom = infra_dir / "pom.xml"
    try:
        root = ET.parse(pom).getroot()
    except (OSError, ET.ParseError) as exc:
        raise BrokerFetchError(f"cannot read the broker pom {pom}: {exc}") from exc
    node = root.find("m:properties/m:kafka.version", _POM_NS)
    if node is None or not (node.text or "").strip():
        raise BrokerFetchError(f"{pom} has no <properties><kafka.version>")
    return (node.text or "").strip()


def _default_cache_root() -> Path:
    # Fixed, like spendbus.settings' default: the CLI passes SPENDBUS_CACHE_DIR explicitly.
    return Path.home() / ".cache" / "spendbus"


def _libs_complete(libs: Path, pom_digest: str, version: str) -> bool:
    try:
        marker = json.loads((libs / _MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("pom_sha256") != pom_digest:
        return False
    jars = list(libs.glob("*.jar"))
    return len(jars) == marker.get("jars") and (libs / f"kafka_2.13-{version}.jar").is_file()


def ensure_broker_jars(
    cache_dir: Path | None = None,
    *,
    infra_dir: Path = DEFAULT_INFRA_DIR,
    mvn: str | None = None,
    timeout: float = 900.0,
) -> Path:
    """Return a folder holding the broker and all its runtime jars, fetching them if needed.

    ``cache_dir`` is the spendbus cache root (default ``~/.cache/spendbus``); the jars go to ``<cache_dir>/kafka-<version>/libs``. Idempotent and
    quick once fetched: Maven runs only when that folder is missing or incomplete. The fetch goes
    to a temporary folder renamed into place at the end, so an interrupted fetch never looks
    complete.
    """
    version = kafka_version(infra_dir)
    pom = infra_dir / "pom.xml"
    pom_digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    base = (cache_dir or _default_cache_root()).expanduser().resolve() / f"kafka-{version}"
    libs = base / "libs"
    if _libs_complete(libs, pom_digest, version):
        return libs

    with file_lock(base.parent / f"kafka-{version}.lock"):
        if _libs_complete(libs, pom_digest, version):  # fetched by someone else meanwhile
            return libs
        mvn_bin = mvn or shutil.which("mvn")
        if mvn_bin is None:
            raise BrokerFetchError(
                "Maven (mvn) is not on PATH: it is needed once to fetch the Kafka broker jars "
                f"into {libs}. Install Maven, or set KAFKA_BOOTSTRAP to use an existing cluster."
            )
        staging = base / f"libs.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn_bin,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ]
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise BrokerFetchError(
                f"mvn did not finish in {timeout:.0f}s: {' '.join(cmd)}"
            ) from exc
        jars = sorted(staging.glob("*.jar")) if staging.is_dir() else []
        if proc.returncode != 0 or not (staging / f"kafka_2.13-{version}.jar").is_file():
            shutil.rmtree(staging, ignore_errors=True)
            # Maven 3.8 colours some lines even in batch mode; keep the message plain.
            plain = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
            output = plain.strip().splitlines()[-40:]
            raise BrokerFetchError(
                f"mvn failed (exit {proc.returncode}) fetching Kafka {version}:\n"
                f"  {' '.join(cmd)}\n" + "\n".join(output)
            )
        (staging / _MARKER).write_text(
            json.dumps({"pom_sha256": pom_digest, "jars": len(jars), "version": version})
        )
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
        # A class archive is only valid for the exact jars it was recorded from.
        shutil.rmtree(base / "cds", ignore_errors=True)
    return libs
