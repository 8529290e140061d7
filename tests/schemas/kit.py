"""What the schemas tests share: for pricing, a Sonnet-like price with a long-context tier,
one-table books and the cost of a call at a price; for the shipped schema files, Java
programs run over them with the libraries of ``java/pom.xml`` (Avro Java, a JSON Schema
validator), fetched from Maven Central once into the spendbus cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TypedDict, Unpack

from schemas.pricing import (
    LongContextTier,
    ModelPrice,
    PriceBook,
    PriceTable,
)
from spendbus.stack.broker_process import file_lock

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

SONNET = ModelPrice.of(
    "claude-sonnet-4-5",
    "3.00",
    "15.00",
    long_context=LongContextTier(200_000, Decimal("6.00"), Decimal("22.50")),
)


def table(
    *models: ModelPrice, version: str = "v1", at: datetime = T0, fallback: ModelPrice | None = None
) -> PriceTable:
    return PriceTable(version=version, effective_from=at, models=models, fallback=fallback)


def book(*models: ModelPrice, fallback: ModelPrice | None = None) -> PriceBook:
    return PriceBook([table(*models, fallback=fallback)])


class Tokens(TypedDict, total=False):
    """The token counts ``PriceBook.price`` takes."""

    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int
    output_tokens: int


def cost(price: ModelPrice, **tokens: Unpack[Tokens]) -> int:
    return (
        book(price)
        .price("claude-sonnet-4-5-20250929" if price is SONNET else price.match, at=AT, **tokens)
        .cost_nanos
    )


JAVA_DIR = Path(__file__).resolve().parent / "java"
_MARKER = ".spendbus-complete.json"


def java_libs() -> Path:
    """The folder of ``java/pom.xml``'s jars, fetched by Maven once per version of the pom."""
    pom = JAVA_DIR / "pom.xml"
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()
    cache = Path(os.environ.get("SPENDBUS_CACHE_DIR", Path.home() / ".cache" / "spendbus"))
    libs = cache.expanduser() / f"contract-java-{digest[:12]}" / "libs"

    def complete() -> bool:
        try:
            marker = json.loads((libs / _MARKER).read_text())
        except (OSError, ValueError):
            return False
        return bool(marker.get("jars") == len(list(libs.glob("*.jar"))))

    if complete():
        return libs
    with file_lock(libs.parent.with_suffix(".lock")):
        if complete():  # fetched by another session meanwhile
            return libs
        mvn = shutil.which("mvn")
        assert mvn is not None, "Maven (mvn) is needed to fetch the Java libraries of this test"
        staging = libs.with_name(f"libs.partial-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        command = [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(pom)]
        command += ["dependency:copy-dependencies", f"-DoutputDirectory={staging}"]
        command += ["-DincludeScope=runtime"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        jars = list(staging.glob("*.jar"))
        assert done.returncode == 0 and jars, (
            f"mvn could not fetch the jars ({' '.join(command)}):\n{done.stdout}{done.stderr}"
        )
        (staging / _MARKER).write_text(json.dumps({"jars": len(jars)}))
        shutil.rmtree(libs, ignore_errors=True)
        staging.rename(libs)
    return libs


def run_java(program: str, args: list[str], stdin: str = "") -> str:
    """The standard output of ``java/<program>`` (a single-file source) run over ``args``."""
    java = shutil.which("java")
    assert java is not None, "Java 17 is needed to run the Java libraries of this test"
    command = [java, "-cp", f"{java_libs()}/*", str(JAVA_DIR / program), *args]
    done = subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.stdout or done.returncode == 0, f"{program} failed:\n{done.stderr[-4000:]}"
    return done.stdout
