"""`spendbus price` and `spendbus prices check`, through click's CliRunner."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from spendbus.commands.pricing import parse_at, price, prices, usd_text

PRICES = """
    versions:
      - version: "2026-01"
        effective_from: "2026-01-01T00:00:00Z"
        models:
          - {match: claude-sonnet-4-5, input_per_mtok: "3.00", output_per_mtok: "15.00",
             long_context: {above_input_tokens: 200000, input_per_mtok: "6.00", output_per_mtok: "22.50"}}
          - {match: half, input_per_mtok: "0.0005", output_per_mtok: "0.0005"}
      - version: "2026-06"
        effective_from: "2026-06-01T00:00:00Z"
        models:
          - {match: claude-sonnet-4-5, input_per_mtok: "2.00", output_per_mtok: "10.00"}
"""


@pytest.fixture
def price_file(tmp_path: Path) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(textwrap.dedent(PRICES))
    return path


def run(*args: str, input: str | None = None) -> tuple[int, str, str]:
    """``run("price", ...)`` runs ``spendbus price``; ``run("check", ...)``, ``spendbus prices check``."""
    command, argv = (price, list(args[1:])) if args[0] == "price" else (prices, list(args))
    result = CliRunner().invoke(command, argv, input=input)
    return result.exit_code, result.stdout, result.stderr


def test_price_prints_compact_json(price_file: Path) -> None:
    code, out, _ = run(
        "price",
        "--prices",
        str(price_file),
        "--model",
        "claude-sonnet-4-5-20250929",
        "--input-tokens",
        "1000",
        "--output-tokens",
        "500",
        "--cache-read-tokens",
        "100",
        "--cache-write-tokens",
        "40",
        "--cache-write-1h-tokens",
        "10",
        "--at",
        "2026-03-01T12:00:00Z",
    )
    assert code == 0
    # 1000 x 3000 + 500 x 15_000 + 100 x 300 + 30 x 3750 + 10 x 6000
    # = 3_000_000 + 7_500_000 + 30_000 + 112_500 + 60_000 = 10_702_500
    assert out == (
        '{"cost_nanos":10702500,"cost_usd":"0.0107025","price_version":"2026-01",'
        '"matched":"claude-sonnet-4-5","unpriced":false}\n'
    )


def test_price_uses_the_version_at_the_given_time(price_file: Path) -> None:
    args = (
        "price",
        "--prices",
        str(price_file),
        "--model",
        "claude-sonnet-4-5",
        "--input-tokens",
        "1",
    )
    assert json.loads(run(*args, "--at", "2026-06-01T00:00:00Z")[1])["cost_nanos"] == 2000
    assert (
        json.loads(run(*args, "--at", "2026-06-01T01:59:59+02:00")[1])["price_version"] == "2026-01"
    )
    assert json.loads(run(*args, "--at", "2026-05-31")[1])["price_version"] == "2026-01"
    before = json.loads(run(*args, "--at", "2025-12-31T23:59:59Z")[1])
    assert before == {
        "cost_nanos": 0,
        "cost_usd": "0",
        "price_version": None,
        "matched": None,
        "unpriced": True,
    }
    # no --at: now, i.e. the newest version
    assert json.loads(run(*args)[1])["price_version"] == "2026-06"


def test_price_of_an_unknown_model(price_file: Path) -> None:
    code, out, _ = run(
        "price", "--prices", str(price_file), "--model", "mystery", "--input-tokens", "9"
    )
    assert code == 0
    assert json.loads(out) == {
        "cost_nanos": 0,
        "cost_usd": "0",
        "price_version": "2026-06",
        "matched": None,
        "unpriced": True,
    }


def test_price_rounds_half_even(price_file: Path) -> None:
    # 5 tokens at 0.5 nanos = 2.5 -> 2
    code, out, _ = run(
        "price",
        "--prices",
        str(price_file),
        "--model",
        "half",
        "--input-tokens",
        "5",
        "--at",
        "2026-02-01T00:00:00Z",
    )
    assert code == 0
    assert json.loads(out)["cost_nanos"] == 2
    assert json.loads(out)["cost_usd"] == "0.000000002"


def test_price_with_the_shipped_file() -> None:
    code, out, _ = run("price", "--model", "claude-sonnet-4-5", "--input-tokens", "1000000")
    assert code == 0
    result = json.loads(out)
    assert result["cost_usd"] == "6"  # 1M > 200k: the long-context tier
    assert result["matched"] == "claude-sonnet-4-5"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--at", "yesterday"], "not an RFC 3339 time"),
        (["--at", "2026-11-01T00:00:00"], "needs a time zone"),
        (
            ["--cache-write-tokens", "1", "--cache-write-1h-tokens", "2"],
            "part of --cache-write-tokens",
        ),
    ],
)
def test_price_refuses_bad_input(price_file: Path, extra: list[str], message: str) -> None:
    code, _, err = run("price", "--prices", str(price_file), "--model", "m", *extra)
    assert code == 2
    assert message in err


def test_price_refuses_negative_tokens(price_file: Path) -> None:
    code, _, err = run("price", "--prices", str(price_file), "--model", "m", "--input-tokens", "-1")
    assert code == 2
    assert "--input-tokens" in err


def test_a_bad_price_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        'version: v1\neffective_from: "2026-01-01T00:00:00Z"\n'
        "models: [{match: m, input_per_mtok: 1.5, output_per_mtok: '1'}]\n"
    )
    code, _, err = run("price", "--prices", str(path), "--model", "m")
    assert code == 2
    assert str(path) in err and "model 'm'" in err and "'input_per_mtok'" in err
    code, _, err = run("check", "--prices", str(path), "m")
    assert code == 2 and str(path) in err


def test_check_lists_unpriced_models(price_file: Path) -> None:
    code, out, err = run(
        "check", "--prices", str(price_file), "claude-sonnet-4-5", "mystery", "other", "mystery"
    )
    assert code == 1
    assert out == "mystery\nother\n"
    assert "2 of 3 model(s) unpriced" in err
    code, out, _ = run(
        "check",
        "--prices",
        str(price_file),
        "claude-sonnet-4-5",
        "us.anthropic.claude-sonnet-4-5-v1:0",
    )
    assert (code, out) == (0, "")


def test_check_at_a_time(price_file: Path) -> None:
    # "half" exists only in the first version
    assert run("check", "--prices", str(price_file), "--at", "2026-02-01T00:00:00Z", "half")[0] == 0
    assert run("check", "--prices", str(price_file), "--at", "2026-07-01T00:00:00Z", "half")[
        :2
    ] == (1, "half\n")
    code, out, err = run(
        "check", "--prices", str(price_file), "--at", "2020-01-01T00:00:00Z", "claude-sonnet-4-5"
    )
    assert (code, out) == (1, "claude-sonnet-4-5\n")
    assert "none in force" in err


def test_check_models_from_a_file_or_stdin(price_file: Path, tmp_path: Path) -> None:
    listing = tmp_path / "models.txt"
    listing.write_text("# models seen last month\nclaude-sonnet-4-5\n\n  mystery  \n")
    code, out, _ = run("check", "--prices", str(price_file), "--models-from", str(listing))
    assert (code, out) == (1, "mystery\n")
    code, out, _ = run(
        "check", "--prices", str(price_file), "--models-from", "-", "extra", input="mystery\n"
    )
    assert (code, out) == (1, "extra\nmystery\n")


def test_check_with_a_fallback_prices_everything(tmp_path: Path) -> None:
    path = tmp_path / "fallback.yaml"
    path.write_text(
        'version: v1\neffective_from: "2026-01-01T00:00:00Z"\n'
        "models: [{match: m, input_per_mtok: '1', output_per_mtok: '1'}]\n"
        "fallback: {input_per_mtok: '10', output_per_mtok: '10'}\n"
    )
    # ("m" does not price "mystery": an entry prices its id and its snapshots only)
    code, out, err = run("check", "--prices", str(path), "m", "m-2025-01-01", "mystery", "zeta")
    assert (code, out) == (0, "")
    assert "2 priced by the fallback: mystery, zeta" in err
    code, out, _ = run("price", "--prices", str(path), "--model", "zeta", "--output-tokens", "1")
    assert json.loads(out)["matched"] == "*"
    assert json.loads(out)["cost_nanos"] == 10_000


def test_check_needs_models(price_file: Path) -> None:
    code, _, err = run("check", "--prices", str(price_file))
    assert code == 2
    assert "give model ids" in err


def test_the_shipped_file_prices_current_models() -> None:
    models = ["claude-opus-4-5", "gpt-5-mini", "gemini-2.5-flash", "us.amazon.nova-lite-v1:0"]
    assert run("check", *models)[:2] == (0, "")


def test_helpers() -> None:
    assert usd_text(0) == "0"
    assert usd_text(15_000_000_000) == "15"
    assert usd_text(10_500_000) == "0.0105"
    assert usd_text(1) == "0.000000001"
    assert parse_at("2026-11-30").isoformat() == "2026-11-30T00:00:00+00:00"
    assert parse_at("2026-11-30T10:00:00+01:00").isoformat() == "2026-11-30T09:00:00+00:00"
