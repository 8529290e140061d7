"""`spendbus prices update`: both maps fetched over HTTP (a local server here, never the
internet), what they agree on shown as a diff and applied as a new dated version."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from schemas.pricing import PriceBook, load_price_file
from schemas.pricing.writer.refresh import PUBLISHED
from spendbus.cli import cli

MAPS = Path(__file__).parent / "price_maps"
BASE = MAPS / "base.yaml"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    """The test maps served on 127.0.0.1 (a free port): the base URL."""
    handler = functools.partial(_Quiet, directory=str(MAPS))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def update(server: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        cli,
        [
            "prices",
            "update",
            "--base",
            str(BASE),
            "--litellm-url",
            f"{server}/litellm_excerpt.json",
            "--genai-prices-url",
            f"{server}/genai_prices_excerpt.json",
            "--effective-from",
            "2026-12-01",
            *args,
        ],
    )
    return result.exit_code, result.stdout, result.stderr


def test_update_shows_what_both_maps_agree_on_as_a_diff(server: str) -> None:
    code, out, err = update(server)
    assert code == 1, err  # prices differ, as `prices diff`
    lines = out.splitlines()
    # both maps say Opus 4.5 is 5 / 25 (LiteLLM's dated id, genai-prices' alias): taken
    assert "~ claude-opus-4-5  input_per_mtok  15.00 -> 5" in lines
    # gemini-2.5-flash: both give 0.30 / 2.50, a model our base lacks: added
    assert "+ gemini-2.5-flash  input_per_mtok  0.3" in lines
    # a model only one map prices (gpt-5.1, LiteLLM's) is not taken
    assert not any(" gpt-5.1 " in line for line in lines)
    assert "model(s) the maps agree on" in err


def test_update_writes_a_new_version_from_the_effective_date(server: str, tmp_path: Path) -> None:
    out = tmp_path / "prices.yaml"
    code, _, err = update(server, "-o", str(out), "--version", "maps-test")
    assert code == 1, err
    tables = load_price_file(out)
    assert [t.version for t in tables] == ["base-2026-11-01", "maps-test"]
    assert tables[0] == load_price_file(BASE)[0]  # the base version is kept as it was
    book = PriceBook(tables)
    before = book.price(
        "claude-opus-4-5", at=datetime(2026, 11, 30, tzinfo=UTC), input_tokens=10**6
    )
    after = book.price("claude-opus-4-5", at=datetime(2026, 12, 1, tzinfo=UTC), input_tokens=10**6)
    assert (before.cost_nanos, before.price_version) == (15 * 10**9, "base-2026-11-01")
    assert (after.cost_nanos, after.price_version) == (5 * 10**9, "maps-test")
    entry = next(m for m in tables[1].models if m.match == "claude-opus-4-5")
    assert (
        entry.source is not None and "litellm:" in entry.source and "genai-prices:" in entry.source
    )


def test_an_unreachable_map_is_bad_input_naming_the_url(server: str) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "prices",
            "update",
            "--base",
            str(BASE),
            "--litellm-url",
            f"{server}/missing.json",
            "--genai-prices-url",
            f"{server}/genai_prices_excerpt.json",
            "--effective-from",
            "2026-12-01",
        ],
    )
    assert result.exit_code == 2
    assert f"{server}/missing.json: cannot fetch" in result.stderr


def test_the_default_urls_are_the_maintainers_published_maps() -> None:
    assert PUBLISHED["litellm"].endswith("/model_prices_and_context_window.json")
    assert PUBLISHED["genai-prices"].startswith("https://raw.githubusercontent.com/pydantic/")
