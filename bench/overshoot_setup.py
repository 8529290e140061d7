"""The overshoot bench's options and what every phase shares: the budget, org and virtual
key of a phase, the gateway replicas' config, and the fake provider in its own process."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from ingest.gateway import parse_config
from runtime.kafka import PLAINTEXT, KafkaSecurity
from schemas.budgets import Budget, budgets_from_yaml
from schemas.pricing import PriceBook
from schemas.topics import Topics
from spendbus.stack.broker_probe import free_port

ROOT = Path(__file__).resolve().parents[1]
NANOS = 1_000_000_000
MODEL = "claude-sonnet-4-5"
#: prompt text is cut from this (the fake provider bills about 4 characters per token)
PROSE = (
    "Summarise the retention policy of usage.raw for the finance team, list the budgets "
    "that crossed their alert thresholds last week and explain each refusal. "
)
SECRET = "sk-overshoot"
RESULTS = ROOT / "bench" / "results"


@dataclass(frozen=True)
class Options:
    clients: int = 50
    replicas: int = 3
    cap_usd: Decimal = Decimal("4")
    max_seconds: float = 45.0
    stop_after_refusals: int = 10
    refusal_pause_ms: float = 100.0
    #: refusals stop the run only after this long without an allowed request or open stream
    quiet_s: float = 3.0
    latency_ms: float = 250.0
    chunk_latency_ms: float = 6.0
    max_tokens: int = 1024
    #: prompt size range (tokens) drawn per request: calls cost from ~1 to ~3 cents
    prompt_tokens: tuple[int, int] = (1_000, 6_000)
    flush_interval_s: float = 5.0
    sample_ms: float = 100.0
    seed: int = 7
    #: also run ``ours_unshared``: every enforcer with replicas=1 (per-process holds only)
    unshared_comparison: bool = True
    #: the phases to run (``ours`` and ``baseline`` always side by side when both are named)
    phases: tuple[str, ...] = ("ours", "baseline", "ours_unshared", "scaling")
    #: ``scaling``: the live replica counts, in order, each change when the true spend
    #: reaches the next fraction of the cap (the enforcers count themselves: membership)
    scaling: tuple[int, ...] = (2, 6, 3)
    scale_at: tuple[float, ...] = (0.3, 0.6)
    #: ``scaling``: the enforcers' max_replicas and membership grace
    max_replicas: int = 8
    membership_grace_s: float = 5.0

    @property
    def cap_nanos(self) -> int:
        return int(self.cap_usd * NANOS)


@dataclass
class Env:
    bootstrap: str
    topics: Topics
    upstream_url: str
    prices: PriceBook
    home: Path
    run_id: str
    security: KafkaSecurity = PLAINTEXT


def budget_for(kind: str, run_id: str, cap_usd: Decimal) -> Budget:
    [budget] = budgets_from_yaml(
        [
            {
                "id": f"cap-{kind}-{run_id}",
                "scope": "org",
                "match": {"org_id": org_for(kind, run_id)},
                "window": "total",
                "limit_usd": str(cap_usd),
                "action": "enforce",
            }
        ]
    )
    return budget


def org_for(kind: str, run_id: str) -> str:
    return f"ovs-{kind}-{run_id}"


def virtual_key(kind: str, run_id: str) -> str:
    return f"vk-overshoot-{kind}-{run_id}-0123456789"


def gateway_config(env: Env, kind: str, replica: int) -> Any:
    return parse_config(
        {
            "gateway_id": f"ovs-{kind}-r{replica}",
            "upstreams": {"anthropic": {"api": "anthropic", "base_url": env.upstream_url}},
            "secrets": {SECRET: {"upstream": "anthropic", "api_key": "fake-provider-credential"}},
            "keys": [
                {
                    "name": f"overshoot-{kind}",
                    "key": virtual_key(kind, env.run_id),
                    "principal": {
                        "org_id": org_for(kind, env.run_id),
                        "secret_id": SECRET,
                        "user_id": "bench@example.com",
                    },
                }
            ],
        },
        "bench_overshoot",
    )


def start_upstream(opts: Options, run_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The fake providers in their own process (the gateways' process keeps its CPU)."""
    port = free_port()
    run_dir.mkdir(parents=True, exist_ok=True)
    log = (run_dir / "fake-upstream.log").open("ab")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spendbus",
            "fake-upstream",
            "--port",
            str(port),
            "--latency-ms",
            str(opts.latency_ms),
            "--chunk-latency-ms",
            str(opts.chunk_latency_ms),
            "--seed",
            str(opts.seed),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the fake upstream exited with {process.returncode}")
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"{url}/healthz", timeout=1).read()
            return process, url
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("the fake upstream did not answer in 60 s")
