"""`spendbus fake-upstream`: the LLM providers' endpoints, faked, for tests, demos and benchmarks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from pydantic import ValidationError

if TYPE_CHECKING:
    from spendbus.fake_upstream import FakeUpstreamConfig


@click.command("fake-upstream")
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option("--port", default=8790, show_default=True, type=int, help="Listen port (0: any).")
@click.option(
    "--latency-ms", default=0.0, show_default=True, type=float, help="Time to the first byte."
)
@click.option(
    "--chunk-latency-ms",
    default=0.0,
    show_default=True,
    type=float,
    help="Time between two streamed chunks.",
)
@click.option(
    "--error-rate",
    default=0.0,
    show_default=True,
    type=float,
    help="Share of requests answered with an error status.",
)
@click.option(
    "--error-status",
    "error_statuses",
    multiple=True,
    type=int,
    help="Error statuses to draw from (repeatable; default 429 and 500).",
)
@click.option(
    "--cut-rate",
    default=0.0,
    show_default=True,
    type=float,
    help="Share of responses whose connection drops before the usage.",
)
@click.option(
    "--stream-error-rate",
    default=0.0,
    show_default=True,
    type=float,
    help="Share of streams that send the provider's error event after the 200.",
)
@click.option(
    "--cache-ratio",
    default=0.0,
    show_default=True,
    type=float,
    help="Probability that a prompt is read from the cache (else written, where billed).",
)
@click.option(
    "--output-tokens",
    nargs=2,
    type=int,
    default=(16, 512),
    show_default=True,
    help="Range of output tokens per answer (capped by the request's max tokens).",
)
@click.option("--gzip", "gzip_", is_flag=True, help="Gzip bodies for clients that accept it.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of usage and faults.")
@click.option(
    "--admin-key-file",
    default=None,
    help="File (or - for stdin) whose first line is the admin key the usage reports want "
    "(GET /v1/organization/usage/completions, /v1/organizations/usage_report/messages).",
)
@click.option(
    "--price-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The price list the providers bill by in their cost reports (default: the shipped one).",
)
def fake_upstream(
    host: str,
    port: int,
    latency_ms: float,
    chunk_latency_ms: float,
    error_rate: float,
    error_statuses: tuple[int, ...],
    cut_rate: float,
    stream_error_rate: float,
    cache_ratio: float,
    output_tokens: tuple[int, int],
    gzip_: bool,
    seed: int,
    admin_key_file: str | None,
    price_file: Path | None,
) -> None:
    """Serve Anthropic, OpenAI, Gemini and Bedrock endpoints with their real wire formats.

    Usage is deterministic from --seed and each request; GET /stats sums what
    was served and billed; with --admin-key-file, the providers' admin usage reports
    aggregate every call billed (`spendbus reconcile fetch` reads them). Runs until Ctrl-C.
    """
    from spendbus.fake_upstream import FakeUpstreamConfig

    values: dict[str, Any] = {
        "host": host,
        "port": port,
        "latency_ms": latency_ms,
        "chunk_latency_ms": chunk_latency_ms,
        "error_rate": error_rate,
        "cut_rate": cut_rate,
        "stream_error_rate": stream_error_rate,
        "cache_ratio": cache_ratio,
        "output_tokens": tuple(output_tokens),
        "gzip": gzip_,
        "seed": seed,
    }
    if price_file is not None:
        values["price_file"] = price_file
    if admin_key_file is not None:
        from spendbus.secret_input import read_secret

        values["admin_key"] = read_secret(admin_key_file, "admin key")
    if error_statuses:
        values["error_statuses"] = tuple(error_statuses)
    try:
        config = FakeUpstreamConfig(**values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise click.UsageError(problems) from None
    try:
        asyncio.run(_run(config))
    except KeyboardInterrupt:
        click.echo("fake upstream stopped", err=True)


async def _run(config: FakeUpstreamConfig) -> None:
    from spendbus.fake_upstream import FakeUpstream

    upstream = FakeUpstream(config)
    try:
        url = await upstream.start()
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {config.host}:{config.port}: {exc}") from None
    click.echo(f"fake upstream listening on {url}")
    click.echo(
        f"  ANTHROPIC_BASE_URL={url}  OPENAI_BASE_URL={url}/v1  "
        f"Gemini: {url}/v1beta  Bedrock: {url}/model/<id>/converse[-stream]  stats: {url}/stats",
    )
    try:
        await asyncio.Event().wait()
    finally:
        totals = upstream.stats.as_dict()
        served = {key: totals[key] for key in ("requests", "statuses", "cuts", "stream_errors")}
        click.echo(f"served {json.dumps(served)}", err=True)
        await upstream.stop()
