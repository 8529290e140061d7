"""``spendbus tap``: look at what a usage tap reads.

``spendbus tap inspect --format FORMAT [--request REQUEST.json] RESPONSE_FILE``
runs the tap of ``FORMAT`` over a response captured as received (a gzip body
is recognised) and prints one compact JSON object: the normalised usage, its
``usage_source`` and, when estimated, ``estimate_reason``.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ingest.taps import FORMATS, inspect_response

_CUTS = ("client_disconnected", "upstream_cut")


@click.group(name="tap")
def tap() -> None:
    """Inspect the usage taps that meter LLM responses."""


@tap.command(name="inspect")
@click.option(
    "--format", "fmt", required=True, type=click.Choice(FORMATS), help="The response's API format."
)
@click.option(
    "--request",
    "request_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The request body sent upstream (JSON), for model, limits and estimates.",
)
@click.option(
    "--content-encoding",
    help="The response's Content-Encoding (default: gzip when the file starts like gzip).",
)
@click.option("--content-type", help="The response's Content-Type (default: detected).")
@click.option(
    "--streaming/--no-streaming", default=None, help="Force the framing (default: detected)."
)
@click.option("--status", type=int, help="The upstream HTTP status (default: 200).")
@click.option("--model", help="The model when the response does not name it (Gemini, Bedrock).")
@click.option("--cut", type=click.Choice(_CUTS), help="How the response ended, if not normally.")
@click.argument(
    "response_file", type=click.Path(exists=True, dir_okay=False, allow_dash=False, path_type=Path)
)
def inspect(
    fmt: str,
    request_path: Path | None,
    content_encoding: str | None,
    content_type: str | None,
    streaming: bool | None,
    status: int | None,
    model: str | None,
    cut: str | None,
    response_file: Path,
) -> None:
    """Print the usage a tap reads from RESPONSE_FILE, as one JSON object."""
    result = inspect_response(
        fmt,
        response_file,
        request=request_path,
        content_encoding=content_encoding,
        content_type=content_type,
        streaming=streaming,
        status=status,
        model=model,
        cut=cut,
    )
    click.echo(json.dumps(result.as_dict(), separators=(",", ":")))
