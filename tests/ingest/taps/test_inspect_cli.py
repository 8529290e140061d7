"""``spendbus tap inspect`` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from spendbus.commands.tap import tap
from tests.ingest.taps.taps_support import CAPTURES, encode_events, gzipped


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(tap, ["inspect", *args])
    return result.exit_code, result.output


def test_inspect_prints_one_compact_json_object() -> None:
    code, out = invoke(
        "--format",
        "anthropic-messages",
        "--request",
        str(CAPTURES / "anthropic/request_cache.json"),
        str(CAPTURES / "anthropic/stream_cache.sse"),
    )
    assert code == 0, out
    assert out.count("\n") == 1 and " " not in out.strip()
    assert json.loads(out) == {
        "model": "claude-sonnet-4-5-20250929",
        "input_tokens": 21,
        "cache_read_tokens": 18420,
        "cache_write_tokens": 2051,
        "cache_write_1h_tokens": 1027,
        "output_tokens": 34,
        "reasoning_tokens": 0,
        "usage_source": "reported",
        "service_tier": "standard",
    }


def test_inspect_reads_a_gzip_capture(tmp_path: Path) -> None:
    path = tmp_path / "resp.sse.gz"
    path.write_bytes(gzipped((CAPTURES / "openai_chat/stream_usage.sse").read_bytes()))
    code, out = invoke("--format", "openai-chat", str(path))
    assert code == 0, out
    assert json.loads(out)["input_tokens"] == 93


def test_inspect_estimated_has_a_reason() -> None:
    code, out = invoke(
        "--format",
        "openai-chat",
        "--request",
        str(CAPTURES / "openai_chat/request_no_usage.json"),
        str(CAPTURES / "openai_chat/stream_no_usage.sse"),
    )
    assert code == 0, out
    obj = json.loads(out)
    assert obj["usage_source"] == "estimated"
    assert obj["estimate_reason"].startswith("no_usage")


def test_inspect_bedrock_frames_with_model_and_cut(tmp_path: Path) -> None:
    path = tmp_path / "converse.bin"
    path.write_bytes(b"".join(encode_events("bedrock/stream_cache.events.json")[:3]))
    code, out = invoke(
        "--format", "bedrock-converse", "--model", "m", "--cut", "upstream_cut", str(path)
    )
    assert code == 0, out
    obj = json.loads(out)
    assert (obj["model"], obj["usage_source"], obj["estimate_reason"]) == (
        "m",
        "estimated",
        "upstream_cut",
    )


def test_inspect_rejects_an_unknown_format() -> None:
    code, out = invoke("--format", "nope", str(CAPTURES / "gemini/body.json"))
    assert code == 2
    assert "nope" in out
