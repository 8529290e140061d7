"""The overshoot bench's clients, in their own process as real clients are (the bench's
process runs the gateways and enforcers): ``drive`` starts them and samples the spend,
``clients`` streams through the live replicas until every one refuses.

    python bench/overshoot_clients.py --spec JSON   (started by drive, not by hand)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `bench.*`, also when run as a script

import aiohttp  # noqa: E402

from bench.overshoot_ledger import Ledger  # noqa: E402
from bench.overshoot_setup import MODEL, PROSE, Options  # noqa: E402


async def drive(
    opts: Options,
    urls: list[str],
    key: str,
    ledger: Ledger,
    gate_view: Any,
    *,
    urls_file: Path | None = None,
    on_sample: Any = None,
) -> dict[str, Any]:
    """Run the clients (:func:`clients`, in their own process, as real clients would be:
    this one runs the gateways and enforcers) and sample spend every ``sample_ms``
    (``on_sample(t)`` after each sample: the scaling phase scales from there)."""
    #: (t, true spend, what the gates saw spent, held (ours) or not yet flushed (baseline))
    samples: list[tuple[float, int, int, int]] = []
    loop_lag_ms: list[float] = []

    async def sampler() -> None:
        while True:
            t = time.monotonic() - ledger.started
            view, held = gate_view()
            samples.append((t, ledger.nanos, view, held))
            if on_sample is not None:
                on_sample(t)
            asked = opts.sample_ms / 1000
            before = time.monotonic()
            await asyncio.sleep(asked)
            # how late this process's event loop wakes up (it runs the gateways and enforcers)
            loop_lag_ms.append((time.monotonic() - before - asked) * 1000)

    sampling = asyncio.create_task(sampler())
    spec = {
        "opts": {**opts.__dict__, "cap_usd": str(opts.cap_usd)},
        "urls": urls,
        "key": key,
        "urls_file": None if urls_file is None else str(urls_file),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--spec",
        json.dumps(spec),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    assert process.stdout is not None and process.stderr is not None
    errors = asyncio.create_task(process.stderr.read())
    # the clients' first line says they start: the phase's clock starts there too
    first = await process.stdout.readline()
    if first.strip():
        ledger.started = time.monotonic()
        samples.clear()
    out = await process.stdout.read()
    await process.wait()
    err = await errors
    await asyncio.sleep(0.3)  # the last usage events are published after the client's last byte
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    if process.returncode != 0:
        raise RuntimeError(f"the clients' process failed:\n{err.decode(errors='replace')[-3000:]}")
    load: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return {**load, "samples": samples, "loop_lag_ms": loop_lag_ms}


class LiveUrls:
    """The replicas' URLs, re-read from a file the bench rewrites as it scales (as a
    client behind a load balancer only reaches the pods that are live)."""

    def __init__(self, urls: list[str], path: str | None) -> None:
        self.path = Path(path) if path else None
        self.urls = urls
        self._mtime = -1.0

    def current(self) -> list[str]:
        if self.path is not None:
            mtime = self.path.stat().st_mtime
            if mtime != self._mtime:
                self._mtime = mtime
                self.urls = json.loads(self.path.read_text())
        return self.urls


def write_urls(path: Path, urls: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(urls))
    tmp.replace(path)  # atomic: a client never reads half a list


async def clients(
    opts: Options, urls: list[str], key: str, urls_file: str | None = None
) -> dict[str, Any]:
    """``opts.clients`` streaming clients, round-robin over ``urls`` (or the live list in
    ``urls_file``), until every live replica refused ``stop_after_refusals`` in a row or
    ``max_seconds`` passed."""
    live = LiveUrls(urls, urls_file)

    def body(rng: random.Random) -> bytes:
        chars = rng.randint(*opts.prompt_tokens) * 4
        prompt = (PROSE * (chars // len(PROSE) + 1))[:chars]
        return json.dumps(
            {
                "model": MODEL,
                "max_tokens": opts.max_tokens,
                "stream": True,
                "messages": [{"role": "user", "content": prompt}],
            }
        ).encode()

    headers = {
        "x-api-key": key,
        "content-type": "application/json",
        "anthropic-version": "2023-06-01",
    }
    stop = asyncio.Event()
    in_row: dict[str, int] = {}
    turn = iter(range(10**12))
    counts = {"calls": 0, "refusals": 0, "errors": 0}
    statuses: dict[str, int] = {}
    streaming = 0
    last_allowed = time.monotonic()

    def spent() -> bool:
        """Every replica refuses, and goes on refusing with nothing left to settle: an
        in-flight refusal lifts once holds settle and the verdict catches up, so refusals
        only count once no stream is open and none was allowed for ``quiet_s``."""
        return (
            min(in_row.get(url, 0) for url in live.current()) >= opts.stop_after_refusals
            and streaming == 0
            and time.monotonic() - last_allowed >= opts.quiet_s
        )

    async def client(session: aiohttp.ClientSession, number: int) -> None:
        nonlocal streaming, last_allowed
        rng = random.Random(opts.seed * 1_000_003 + number)  # the same workload in every phase
        while not stop.is_set():
            targets = live.current()
            replica = targets[next(turn) % len(targets)]
            try:
                response = await session.post(
                    replica + "/v1/messages", data=body(rng), headers=headers
                )
            except aiohttp.ClientConnectionError:  # a replica scaled down under us
                counts["errors"] += 1
                await asyncio.sleep(opts.refusal_pause_ms / 1000)
                continue
            async with response:
                statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1
                if response.status == 200:
                    streaming += 1
                    last_allowed = time.monotonic()
                    in_row[replica] = 0
                    try:
                        async for _ in response.content.iter_any():
                            pass
                    except aiohttp.ClientError:  # cut by a replica scaling down
                        counts["errors"] += 1
                        continue
                    finally:
                        streaming -= 1
                    counts["calls"] += 1
                    continue
                await response.read()
                if response.status in (402, 429):
                    counts["refusals"] += 1
                    in_row[replica] = in_row.get(replica, 0) + 1
                    if spent():
                        stop.set()
                else:
                    counts["errors"] += 1
            await asyncio.sleep(opts.refusal_pause_ms / 1000)

    print(json.dumps({"started": True}), flush=True)
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(client(session, n)) for n in range(opts.clients)]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), opts.max_seconds)
        stopped_by = "refusals" if stop.is_set() else "time"
        stopped_at = time.monotonic() - started
        stop.set()
        await asyncio.gather(*tasks)
    return {
        **counts,
        "statuses": statuses,
        "stopped_by": stopped_by,
        "stopped_at_s": round(stopped_at, 2),
    }


def main() -> None:
    """The clients' process of one phase (see :func:`drive`): the last line is its JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--spec", required=True, help="what drive passes: options, URLs, key")
    spec = json.loads(parser.parse_args().spec)
    fields = spec["opts"]
    fields["cap_usd"] = Decimal(fields["cap_usd"])
    for name in ("prompt_tokens", "phases", "scaling", "scale_at"):
        fields[name] = tuple(fields[name])
    load = clients(Options(**fields), spec["urls"], spec["key"], spec.get("urls_file"))
    print(json.dumps(asyncio.run(load)))


if __name__ == "__main__":
    main()
