"""`spendbus ingest FILE.jsonl`: bad lines named by number and field; nothing published unless
--skip-invalid, which writes the rejects beside the file and publishes the rest."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingest.jsonl import InvalidLines, ingest_file, rejects_path_for, validate_file
from ingest.publisher import PublisherConfig, UsagePublisher
from schemas.topics import Topics
from spendbus.commands.ingest import ingest
from tests.ingest.http.kit import consume, json_event


def write_lines(path: Path, lines: list[object]) -> Path:
    text = []
    for line in lines:
        text.append(line if isinstance(line, str) else json.dumps(line))
    path.write_text("\n".join(text) + "\n")
    return path


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[Path, list[dict[str, object]]]:
    good = [json_event(i) for i in range(5)]
    lines: list[object] = [
        good[0],
        {**json_event(90), "input_tokens": -3},  # line 2
        good[1],
        "",  # blank lines are skipped, still numbered
        '{"event_id": "x", oops',  # line 5
        good[2],
        {**json_event(91), "output_tokens": "lots"},  # line 7
        good[3],
        [1, 2],  # line 9
        good[4],
    ]
    return write_lines(tmp_path / "usage.jsonl", lines), good


def test_errors_name_the_line_and_the_field(mixed: tuple[Path, list[dict[str, object]]]) -> None:
    path, _ = mixed
    report = validate_file(path, skip_invalid=False)
    assert (report.valid, report.rejected) == (5, 4)
    assert [(e.line, e.field) for e in report.errors] == [
        (2, "input_tokens"),
        (5, "<json>"),
        (7, "output_tokens"),
        (9, "<event>"),
    ]
    assert report.errors[0].describe().startswith("line 2 (event ")
    assert "must be >= 0, got -3" in report.errors[0].describe()
    assert not rejects_path_for(path).exists()


async def test_an_invalid_line_stops_everything_before_publishing(
    mixed: tuple[Path, list[dict[str, object]]],
    tmp_path: Path,
    kafka_bootstrap: str,
    topics: Topics,
) -> None:
    path, _ = mixed
    config = PublisherConfig(
        bootstrap=kafka_bootstrap, topic_prefix=topics.prefix, spool_dir=tmp_path / "spool"
    )
    async with UsagePublisher(config) as pub:
        with pytest.raises(InvalidLines) as caught:
            await ingest_file(path, pub)
        assert "line 2" in str(caught.value)
        assert pub.spooled_bytes == 0
        assert pub.metrics.registry.get_sample_value("spendbus_ingest_spooled_events_total") == 0


def test_cli_skip_invalid_publishes_the_rest_and_writes_the_rejects(
    mixed: tuple[Path, list[dict[str, object]]],
    tmp_path: Path,
    kafka_bootstrap: str,
    topics: Topics,
) -> None:
    path, good = mixed
    args = [
        str(path),  # `spendbus ingest FILE.jsonl`: routed to `ingest file`
        "--bootstrap",
        kafka_bootstrap,
        "--topic-prefix",
        topics.prefix,
        "--spool-dir",
        str(tmp_path / "spool"),
        "--json",
    ]
    refused = CliRunner().invoke(ingest, args)
    assert refused.exit_code == 1, refused.output
    assert "line 2" in refused.output and "nothing published" in refused.output

    result = CliRunner().invoke(ingest, [*args, "--skip-invalid"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["published"] == 5 and summary["rejected"] == 4
    rejects = [json.loads(line) for line in rejects_path_for(path).read_text().splitlines()]
    assert [(r["line"], r["field"]) for r in rejects] == [
        (2, "input_tokens"),
        (5, "<json>"),
        (7, "output_tokens"),
        (9, "<event>"),
    ]
    assert rejects[2]["reason"] == "must be an integer, got 'lots'"
    assert json.loads(rejects[0]["raw"])["input_tokens"] == -3

    got = asyncio.run(consume(kafka_bootstrap, topics.usage_raw, 5))
    assert sorted(e["event_id"] for _, e in got) == sorted(str(g["event_id"]) for g in good)


def test_serve_and_file_commands_both_resolve() -> None:
    runner = CliRunner()
    serve = runner.invoke(ingest, ["serve", "--help"])
    assert serve.exit_code == 0 and "--token" in serve.output
    file = runner.invoke(ingest, ["file", "--help"])
    assert file.exit_code == 0 and "--skip-invalid" in file.output
    missing = runner.invoke(ingest, ["no-such-file.jsonl"])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_serve_refuses_to_start_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPENDBUS_INGEST_TOKEN", raising=False)
    result = CliRunner().invoke(ingest, ["serve", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code != 0
    assert "token" in str(result.exception)
