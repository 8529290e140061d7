"""`spendbus price --batch FILE.jsonl`: many calls in one run, a bad line reported by
number and field without stopping the rest (issue 38, item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from spendbus.commands.price_batch import BadLine, read_call
from spendbus.commands.pricing import price

PRICES = """\
versions:
  - version: "2026-01"
    effective_from: "2026-01-01T00:00:00Z"
    models:
      - {match: claude-sonnet-4-5, input_per_mtok: "3.00", output_per_mtok: "15.00"}
  - version: "2026-06"
    effective_from: "2026-06-01T00:00:00Z"
    models:
      - {match: claude-sonnet-4-5, input_per_mtok: "2.00", output_per_mtok: "10.00"}
"""


@pytest.fixture
def price_file(tmp_path: Path) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(PRICES)
    return path


def run_batch(
    price_file: Path, lines: list[str], *extra: str
) -> tuple[int, list[dict[str, object]], str]:
    result = CliRunner().invoke(
        price,
        ["--prices", str(price_file), "--batch", "-", *extra],
        input="\n".join(lines) + "\n",
    )
    return result.exit_code, [json.loads(x) for x in result.stdout.splitlines()], result.stderr


def single(price_file: Path, *args: str) -> dict[str, object]:
    result = CliRunner().invoke(price, ["--prices", str(price_file), *args])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


def test_each_line_is_priced_as_one_call_would_be(price_file: Path) -> None:
    code, results, _ = run_batch(
        price_file,
        [
            '{"model": "claude-sonnet-4-5", "input_tokens": 1000, "output_tokens": 500}',
            '{"model": "claude-sonnet-4-5", "input_tokens": 1000, "at": "2026-07-01T00:00:00Z"}',
            '{"model": "mystery-model", "output_tokens": 10}',
        ],
        "--at",
        "2026-03-01T00:00:00Z",
    )
    assert code == 0
    assert [r["line"] for r in results] == [1, 2, 3]
    expected = [
        single(
            price_file,
            "--model",
            "claude-sonnet-4-5",
            "--input-tokens",
            "1000",
            "--output-tokens",
            "500",
            "--at",
            "2026-03-01T00:00:00Z",
        ),
        single(
            price_file,
            "--model",
            "claude-sonnet-4-5",
            "--input-tokens",
            "1000",
            "--at",
            "2026-07-01T00:00:00Z",
        ),
        single(
            price_file,
            "--model",
            "mystery-model",
            "--output-tokens",
            "10",
            "--at",
            "2026-03-01T00:00:00Z",
        ),
    ]
    assert [{k: v for k, v in r.items() if k != "line"} for r in results] == expected
    assert results[0]["cost_nanos"] == 1000 * 3000 + 500 * 15_000
    assert results[1]["price_version"] == "2026-06"  # the line's own time
    assert results[2]["unpriced"] is True


def test_a_bad_line_names_its_number_and_field_and_the_rest_go_on(price_file: Path) -> None:
    code, results, err = run_batch(
        price_file,
        [
            '{"model": "claude-sonnet-4-5", "input_tokens": 10}',
            '{"model": "claude-sonnet-4-5", "input_tokens": -5}',
            "",
            '{"model": "claude-sonnet-4-5", "inptu_tokens": 3}',
            "not json",
            '{"model": "claude-sonnet-4-5", "cache_write_tokens": 1, "cache_write_1h_tokens": 2}',
            '{"model": "claude-sonnet-4-5", "at": "yesterday"}',
            '{"model": "claude-sonnet-4-5", "output_tokens": 2}',
        ],
    )
    assert code == 1
    assert "5 of 7 line(s) could not be priced" in err
    by_line = {int(str(r["line"])): r for r in results}
    assert sorted(by_line) == [1, 2, 4, 5, 6, 7, 8]  # the blank line 3 is no call
    assert by_line[1]["cost_nanos"] == 10 * 2000  # today: the June version
    assert by_line[8]["cost_nanos"] == 2 * 10_000
    assert by_line[2]["error"] == "line 2: input_tokens: must be an integer >= 0, got -5"
    assert str(by_line[4]["error"]).startswith("line 4: inptu_tokens: not a field of a call")
    assert str(by_line[5]["error"]).startswith("line 5: not JSON")
    assert by_line[6]["error"] == (
        "line 6: cache_write_1h_tokens (2) is a part of cache_write_tokens (1)"
    )
    assert by_line[7]["error"] == "line 7: at: not an RFC 3339 time: 'yesterday'"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[1, 2]", "must be a JSON object, got list"),
        ("{}", "model: must be a non-empty string, got null"),
        ('{"model": "  "}', 'model: must be a non-empty string, got "  "'),
        (
            '{"model": "m", "output_tokens": true}',
            "output_tokens: must be an integer >= 0, got true",
        ),
        ('{"model": "m", "output_tokens": 1.5}', "output_tokens: must be an integer >= 0, got 1.5"),
        ('{"model": "m", "units": [1]}', "units: must be an object of unit name to count, got [1]"),
        (
            '{"model": "m", "units": {"web_search": -1}}',
            "units.web_search: must be an integer >= 0, got -1",
        ),
        ('{"model": "m", "service_tier": 3}', "service_tier: must be a string, got 3"),
    ],
)
def test_a_line_that_is_not_a_call_names_the_field(line: str, message: str) -> None:
    with pytest.raises(BadLine) as caught:
        read_call(line)
    assert str(caught.value) == message


def test_a_line_gives_every_field_of_a_call() -> None:
    call = read_call(
        '{"model": "gpt-5", "input_tokens": 1, "cache_read_tokens": 2, "cache_write_tokens": 3,'
        ' "cache_write_1h_tokens": 1, "output_tokens": 4, "units": {"web_search": 2},'
        ' "service_tier": "flex", "at": "2026-01-01"}'
    )
    assert call.model == "gpt-5"
    assert call.tokens == {
        "input_tokens": 1,
        "cache_read_tokens": 2,
        "cache_write_tokens": 3,
        "cache_write_1h_tokens": 1,
        "output_tokens": 4,
    }
    assert (call.units, call.service_tier, call.at) == ({"web_search": 2}, "flex", "2026-01-01")


def test_batch_takes_no_option_of_one_call(price_file: Path) -> None:
    result = CliRunner().invoke(
        price, ["--prices", str(price_file), "--batch", "-", "--input-tokens", "3"], input=""
    )
    assert result.exit_code == 2
    assert "--input-tokens is not allowed with it" in result.output


def test_without_batch_the_model_is_still_required(price_file: Path) -> None:
    result = CliRunner().invoke(price, ["--prices", str(price_file)])
    assert result.exit_code == 2
    assert "Missing option '--model'" in result.output
