"""Benchmark of the enforcer: prints one JSON object.

1. check() in-process with 100k live counters: p50/p99/p99.9 µs per call.
   ``p*_us``: over 45k contexts prebuilt up front and cycled (each check starts
   with its context out of the CPU caches, the harsher case); ``fresh_ctx``: the
   context built (untimed) right before its check, as a proxy does per request;
   ``with_context_build``: building it timed too. Each allowed request's hold is
   released after the timed call, so holds stay steady. The garbage collector runs
   as an embedding proxy leaves it (nothing frozen): its collections and pauses inside
   the timed loop are reported (``gc_during_timed_checks``).
2. The sidecar over loopback, run as ``spendbus enforcer serve`` runs it (uvloop
   when installed, no access log): one server process pinned to one core (the
   affinity ``taskset -c 0`` sets), one client process (raw keep-alive HTTP/1.1
   on N connections) on the other. Rounds alternate between /v1/check and an
   aiohttp no-op handler in the same server (the floor: same client, same
   requests); medians of checks/s, of checks per server CPU-second, and their
   ratio to the floor. Bounded by count and time; 127.0.0.1 only. The server's clock
   moves with wall time and a sweep expires holds after ``SIDECAR_HOLD_S`` (as the
   follower's sweep does after ``hold_timeout``): holds stay steady, about what a
   proxy whose upstream calls take that long keeps in flight; checks/s counts only
   /v1/check answers. Each round reports the server's GC collections and pauses and
   the most holds outstanding; ``--handler-cpu`` adds the thread CPU spent inside
   each handler per request (a timing middleware on every route), to split the
   server's CPU per request into the handler's work and what aiohttp does around it.

No Kafka: the state is fed in memory the way the follower feeds it (the
follower's own cost is the 10k-counter restart test).

    .venv/bin/python bench/bench_enforcer.py [--checks 200000] [--seconds 5] [--connections 32]
        [--only check|sidecar] [--handler-cpu] [--baseline CHECKOUT --rounds 6 --seconds 1.5]

``--baseline``: this tree's sidecar and another checkout's, served at once on the same
pinned core, rounds alternating: the fairest comparison this shared VM allows. Both
run this file's harness over their own code; for the check section, run this file
with ``SPENDBUS_BENCH_ROOT=<checkout>`` to measure another checkout's check().

3. ``--work check|context|handler --work-ops N``: N untimed operations, for instruction
   counts under ``valgrind --tool=cachegrind --cache-sim=no`` (run with 0 and N, take the
   difference / N): figures that do not move with this shared VM's load.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from enforcer_bench_sidecar import bench_side_by_side, bench_sidecar, default_loop
from enforcer_bench_state import BUDGETS, GcPauses, loaded, pct  # first: puts the code on the path

from enforcer import Context

#: --work handler: holds kept in flight (older ones released)
WORK_HOLDS = 1000


def bench_check(checks: int, policy_file: Path | None = None) -> dict[str, Any]:
    e, contexts = loaded(policy_file=policy_file)
    live = len(e.state.verdicts)
    # the collector stays as an embedding proxy leaves it (on, nothing frozen): the pauses
    # it takes inside the timed calls are counted below, not hidden
    gc.collect()
    check, release = e.check, e.holds.release
    perf = time.perf_counter_ns
    for c in contexts[:2000]:  # warm the index, period and price caches
        d = check(c)
        if d.hold_id is not None:
            release(d.hold_id)
    samples: list[int] = []
    cpu_samples: list[int] = []
    refused = 0
    m = len(contexts)
    cpu = time.thread_time_ns
    pauses = GcPauses()
    pauses.__enter__()
    for i in range(checks):
        c = contexts[i % m]
        c0 = cpu()
        t0 = perf()
        d = check(c)
        t1 = perf()
        c1 = cpu()
        samples.append(t1 - t0)
        cpu_samples.append(c1 - c0)
        if d.hold_id is not None:
            release(d.hold_id)
        elif not d.allowed:
            refused += 1
    pauses.__exit__()
    samples.sort()
    us = [s / 1000 for s in samples]
    # context construction + check, as an in-process proxy pays it
    fields = [
        {
            k: getattr(c, k)
            for k in (
                "org_id",
                "secret_id",
                "user_id",
                "session_id",
                "groups",
                "provider",
                "api",
                "model",
                "input_tokens",
                "max_output_tokens",
            )
        }
        for c in contexts[:20000]
    ]
    with_ctx: list[int] = []
    for f in fields:
        t0 = perf()
        d = check(Context(**f))
        with_ctx.append(perf() - t0)
        if d.hold_id is not None:
            release(d.hold_id)
    with_ctx.sort()
    fresh: list[int] = []
    for i in range(checks // 2):
        c = Context(**fields[i % len(fields)])
        t0 = perf()
        d = check(c)
        fresh.append(perf() - t0)
        if d.hold_id is not None:
            release(d.hold_id)
    fresh.sort()
    # memory blocks one check leaves alive while its decision and hold live (rows, tuples,
    # the Decision, the hold): what the collector and the allocator see per request
    kept = []
    blocks = sys.getallocatedblocks()
    for c in contexts[:1000]:
        kept.append(check(c))
    blocks_per_check = (sys.getallocatedblocks() - blocks) / 1000
    for d in kept:
        if d.hold_id is not None:
            release(d.hold_id)
    return {
        "live_counters": live,
        "budgets": len(BUDGETS),
        "checks": checks,
        "refused_fraction": round(refused / checks, 3),
        "p50_us": round(pct(us, 0.50), 2),
        "p99_us": round(pct(us, 0.99), 2),
        "p999_us": round(pct(us, 0.999), 2),
        "mean_us": round(statistics.fmean(us), 2),
        # CPU time of the calling thread: the same calls without the time the OS spent
        # running other processes (this box is shared); includes ~0.3 µs of clock overhead
        "cpu_p50_us": round(pct(sorted(cpu_samples), 0.50) / 1000, 2),
        "cpu_p99_us": round(pct(sorted(cpu_samples), 0.99) / 1000, 2),
        "fresh_ctx_p50_us": round(pct(fresh, 0.50) / 1000, 2),
        "fresh_ctx_p99_us": round(pct(fresh, 0.99) / 1000, 2),
        "fresh_ctx_p999_us": round(pct(fresh, 0.999) / 1000, 2),
        "with_context_build_p50_us": round(pct(with_ctx, 0.50) / 1000, 2),
        "with_context_build_p99_us": round(pct(with_ctx, 0.99) / 1000, 2),
        "blocks_alive_per_decision": round(blocks_per_check, 1),
        "gc_during_timed_checks": pauses.summary(checks),
    }


def calibrate() -> float:
    """ns per iteration of an empty Python loop: how fast this machine is right now
    (~10-20 ns on an idle modern core); scale the figures above by it."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(1_000_000):
            pass
        best = min(best, (time.perf_counter_ns() - t0) / 1_000_000)
    return round(best, 1)


def work(what: str, ops: int) -> dict[str, Any]:
    """``ops`` untimed operations on a 3k-counter state, to count instructions with
    ``valgrind --tool=cachegrind --cache-sim=no``: run it with ``ops`` 0 and N; the
    difference in ``I refs`` / N is the work per operation, whatever else runs on the
    machine (this VM is shared: wall-clock figures move with its load, these do not).

    check: check + release; context: Context.from_mapping of a JSON-decoded body;
    handler: the sidecar's /v1/check work without aiohttp (decode, context, check, the
    answer bytes), the last WORK_HOLDS holds kept in flight (older ones released: steady,
    as the sidecar bench's expiry keeps them; the collector's work is in the count).
    """
    import msgspec

    from enforcer.sidecar_json import decision_json

    e, contexts = loaded(counters=3000)
    bodies = [json.dumps(c.to_json()).encode() for c in contexts]
    decode = msgspec.json.Decoder().decode
    fields = [decode(b) for b in bodies]
    m = len(contexts)
    in_flight: collections.deque[int] = collections.deque()
    for i in range(ops):
        if what == "check":
            d = e.check(contexts[i % m])
            if d.hold_id is not None:
                e.release(d.hold_id)
        elif what == "context":
            Context.from_mapping(fields[i % m])
        else:
            d = e.check(Context.from_mapping(decode(bodies[i % m])))
            decision_json(d)
            if d.hold_id is not None:
                in_flight.append(d.hold_id)
                if len(in_flight) > WORK_HOLDS:
                    e.release(in_flight.popleft())
    return {"work": what, "ops": ops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checks", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=3.0, help="per round")
    parser.add_argument("--max-requests", type=int, default=200_000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default=default_loop(),
        help="the sidecar's event loop (default: what spendbus enforcer serve uses)",
    )
    parser.add_argument(
        "--only", choices=("check", "sidecar"), help="run one section (faster iteration)"
    )
    parser.add_argument(
        "--work",
        choices=("check", "context", "handler"),
        help="only run --work-ops untimed operations (for cachegrind; see work())",
    )
    parser.add_argument("--work-ops", type=int, default=5000)
    parser.add_argument(
        "--policy",
        type=Path,
        help="check: with this Rego policy consulted on every check (enforcer/policy.py)",
    )
    parser.add_argument(
        "--handler-cpu",
        action="store_true",
        help="sidecar: also time the thread CPU inside each handler (adds a middleware hop)",
    )
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="serve this tree's sidecar and CHECKOUT's side by side, alternating rounds",
    )
    args = parser.parse_args()
    if args.work:
        print(json.dumps(work(args.work, args.work_ops)))
        return
    if args.baseline:
        side = bench_side_by_side(args.baseline, args.rounds, args.seconds, args.connections)
        side["load_avg_1m"] = round(os.getloadavg()[0], 2)
        side["cpus"] = os.cpu_count()
        print(json.dumps(side))
        return
    before = calibrate()
    out: dict[str, Any] = {}
    if args.only in (None, "check"):
        out["check"] = bench_check(args.checks, args.policy)
        if args.policy is not None:
            out["check"]["policy"] = str(args.policy)
    if args.only in (None, "sidecar"):
        out["sidecar"] = bench_sidecar(
            args.seconds,
            args.max_requests,
            args.connections,
            args.rounds,
            args.loop,
            args.handler_cpu,
        )
    out |= {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "empty_loop_ns": {"before": before, "after": calibrate()},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
