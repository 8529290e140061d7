"""The on-disk spool: order, bounds, cursor, segment deletion, torn tails and corruption."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.errors import SpoolLocked
from ingest.publisher.spool import HEADER_LEN, Spool, frame, frames_of


def read_all(spool: Spool, pos: int | None = None, chunk: int = 4096) -> list[tuple[bytes, bytes]]:
    pos = spool.acked if pos is None else pos
    out: list[tuple[bytes, bytes]] = []
    while True:
        records, pos = spool.read(pos, chunk)
        if not records:
            return out
        out.extend(records)


def records(n: int, size: int = 40) -> list[tuple[bytes, bytes]]:
    return [(f"org{i % 3}".encode(), f"{i:06d}".encode() + b"v" * size) for i in range(n)]


def test_append_read_in_order_across_segments(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, segment_bytes=4096)
    written = records(500)
    for i in range(0, 500, 7):
        spool.append(frames_of(written[i : i + 7]))
    assert spool.segment_count > 3
    assert read_all(spool, chunk=700) == written
    assert spool.pending_bytes == spool.write_end
    spool.close()


def test_ack_persist_deletes_whole_segments_and_restart_resumes(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, segment_bytes=4096)
    written = records(300)
    for item in written:
        spool.append(frame(*item))
    segments = spool.segment_count
    positions = []  # the offset past each record: read one at a time
    pos = 0
    while True:
        batch, pos = spool.read(pos, 1)
        if not batch:
            break
        assert len(batch) == 1
        positions.append(pos)
    spool.ack(positions[199])
    assert spool.persist() > 0
    assert spool.segment_count < segments
    spool.close()

    reopened = Spool.open(tmp_path, segment_bytes=4096)
    assert reopened.acked == positions[199]
    assert read_all(reopened) == written[200:]
    reopened.close()


def test_the_cursor_is_overwritten_in_place(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, segment_bytes=1 << 20)
    written = records(50)
    spool.append(frames_of(written))
    cursor = tmp_path / "cursor"
    inode = cursor.stat().st_ino
    positions = []
    pos = 0
    for _ in range(3):
        _, pos = spool.read(pos, 1)
        positions.append(pos)
        spool.ack(pos)
        spool.persist()
        assert cursor.stat().st_size == 12
    assert cursor.stat().st_ino == inode  # the same file, never replaced
    assert not (tmp_path / "cursor.tmp").exists()
    spool.close()
    reopened = Spool.open(tmp_path, segment_bytes=1 << 20)
    assert reopened.acked == positions[-1]
    assert read_all(reopened) == written[3:]
    reopened.close()


@pytest.mark.parametrize(
    ("content", "warned"),
    [
        (b"", False),  # created, never written: nothing acknowledged yet
        (b"\x07" * 12, True),  # a torn write: its CRC fails
        (b"\x07" * 5, True),  # cut short
    ],
)
def test_an_unreadable_cursor_means_sending_everything_again(
    tmp_path: Path, content: bytes, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool.open(tmp_path, segment_bytes=1 << 20)
    written = records(20)
    spool.append(frames_of(written))
    spool.ack(spool.write_end)
    spool.close()  # writes the cursor: everything acknowledged
    (tmp_path / "cursor").write_bytes(content)
    with caplog.at_level("WARNING", logger="ingest.publisher.spool"):
        reopened = Spool.open(tmp_path, segment_bytes=1 << 20)
    assert reopened.acked == 0
    assert read_all(reopened) == written  # resent: same bytes, same event ids
    assert ("unreadable cursor" in caplog.text) is warned
    reopened.close()


def test_one_process_per_directory(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, segment_bytes=4096)
    with pytest.raises(SpoolLocked):
        Spool.open(tmp_path, segment_bytes=4096)
    spool.close()
    Spool.open(tmp_path, segment_bytes=4096).close()


def _last_segment(directory: Path) -> Path:
    return sorted(directory.glob("*.seg"))[-1]


@pytest.mark.parametrize(
    "tail",
    [
        pytest.param(frame(b"acme", b"x" * 100)[:-7], id="torn-frame"),
        pytest.param(frame(b"acme", b"x" * 100)[:5], id="torn-header"),
        pytest.param(b"\0" * 512, id="zero-fill"),
        pytest.param(b"\xff" * 64, id="garbage-length"),
    ],
)
def test_torn_tail_is_truncated_on_open(tmp_path: Path, tail: bytes) -> None:
    spool = Spool.open(tmp_path, segment_bytes=1 << 20)
    written = records(50)
    spool.append(frames_of(written))
    end = spool.write_end
    spool.close()
    with _last_segment(tmp_path).open("ab") as f:
        f.write(tail)

    recovered = Spool.open(tmp_path, segment_bytes=1 << 20)
    assert recovered.recovery.truncated_bytes == len(tail)
    assert recovered.write_end == end
    assert read_all(recovered) == written
    # appending after the recovery continues the log cleanly
    recovered.append(frame(b"acme", b"after"))
    assert read_all(recovered)[-1] == (b"acme", b"after")
    recovered.close()
    assert Spool.open(tmp_path, segment_bytes=1 << 20).recovery.truncated_bytes == 0


def test_bad_crc_in_the_last_frame_is_truncated(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, segment_bytes=1 << 20)
    written = records(10)
    spool.append(frames_of(written))
    spool.close()
    path = _last_segment(tmp_path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the last record's value
    path.write_bytes(bytes(data))
    recovered = Spool.open(tmp_path, segment_bytes=1 << 20)
    assert recovered.recovery.truncated_bytes == len(frame(*written[-1]))
    assert read_all(recovered) == written[:-1]
    recovered.close()


def test_corrupt_frame_in_a_sealed_segment_is_skipped_and_counted(tmp_path: Path) -> None:
    spool = Spool.open(tmp_path, segment_bytes=2048)
    written = records(200)
    for item in written:
        spool.append(frame(*item))
    spool.close()
    first = sorted(tmp_path.glob("*.seg"))[0]
    data = bytearray(first.read_bytes())
    data[HEADER_LEN + 20] ^= 0xFF  # inside the first frame's payload
    first.write_bytes(bytes(data))

    reopened = Spool.open(tmp_path, segment_bytes=2048)
    got = read_all(reopened)
    assert reopened.corrupt_bytes == os.path.getsize(first) - HEADER_LEN
    assert got == written[len(written) - len(got) :]  # the rest of that segment is skipped
    reopened.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=40),
    cut=st.floats(min_value=0, max_value=1),
)
def test_any_crash_point_leaves_a_prefix(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], cut: float
) -> None:
    """Whatever byte a crash stops at, reopening yields exactly a prefix of what was written."""
    directory = tmp_path_factory.mktemp("spool")
    spool = Spool.open(directory, segment_bytes=1 << 20)
    written = [(b"k", bytes([i % 251]) * size) for i, size in enumerate(sizes)]
    spool.append(frames_of(written))
    spool.close()
    path = _last_segment(directory)
    size = path.stat().st_size
    os.truncate(path, HEADER_LEN + int((size - HEADER_LEN) * cut))

    recovered = Spool.open(directory, segment_bytes=1 << 20)
    got = read_all(recovered)
    recovered.close()
    assert got == written[: len(got)]
    if cut == 1:
        assert got == written


def test_stray_and_foreign_seg_files_are_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool.open(tmp_path, segment_bytes=4096)
    written = records(100)
    spool.append(frames_of(written))
    spool.close()
    (tmp_path / "backup.seg").write_bytes(b"anything")  # a name this spool never writes
    (tmp_path / "old.seg").mkdir()  # not even a file
    # a foreign file under the name of the next segment this spool would create
    next_name = f"{spool.write_end:020d}.seg"
    (tmp_path / next_name).write_bytes(b"NOT A SPOOL SEGMENT AT ALL")
    with caplog.at_level("WARNING", logger="ingest.publisher.spool"):
        reopened = Spool.open(tmp_path, segment_bytes=4096)
    assert sorted(reopened.recovery.foreign_files) == sorted(["backup.seg", "old.seg", next_name])
    assert sum("skipped" in r.getMessage() for r in caplog.records) == 3
    assert read_all(reopened) == written  # the spool's own records, all of them
    # the foreign file was moved aside on open: the spool rolls onto that name freely
    reopened.append(frames_of(records(200)))
    reopened.close()
    assert (tmp_path / "backup.seg").read_bytes() == b"anything"  # left as it is
    assert (tmp_path / f"{next_name}.foreign").read_bytes() == b"NOT A SPOOL SEGMENT AT ALL"


def test_spool_files_are_private_to_their_owner(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    old_umask = os.umask(0o022)  # the usual umask: would leave files world-readable
    try:
        spool = Spool.open(directory, segment_bytes=4096)
        spool.append(frames_of(records(200)))
        spool.ack(spool.write_end)
        spool.persist()
        spool.close()
    finally:
        os.umask(old_umask)
    assert directory.stat().st_mode & 0o777 == 0o700
    files = list(directory.iterdir())
    assert {p.name for p in files} >= {"LOCK", "cursor"} and any(p.suffix == ".seg" for p in files)
    for path in files:
        assert path.stat().st_mode & 0o777 == 0o600, path.name
    # a spool directory left readable by an older version is made private on open
    directory.chmod(0o755)
    (directory / "cursor").chmod(0o644)
    Spool.open(directory, segment_bytes=4096).close()
    assert directory.stat().st_mode & 0o777 == 0o700
    assert (directory / "cursor").stat().st_mode & 0o777 == 0o600
