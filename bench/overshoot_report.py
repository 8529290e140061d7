"""The overshoot bench's figures: one phase summarised (the overshoot, where it comes
from, the ground truth checks, the timeline), the chart of every phase, the bench's JSON."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from bench.benchkit import pct
from bench.overshoot_baseline import PollGate
from bench.overshoot_ledger import EstimateProbe, Ledger
from bench.overshoot_setup import MODEL, NANOS, Options
from schemas.records import Verdict
from schemas.usage import TOKEN_FIELDS


def summarise(
    kind: str,
    opts: Options,
    ledger: Ledger,
    load: dict[str, Any],
    verdict: Verdict | None,
    upstream: dict[str, Any],
    probes: list[EstimateProbe],
    polls: list[PollGate],
    verdict_lag_ms: list[float],
    enforcer_replicas: int | None = None,
) -> dict[str, Any]:
    cap = opts.cap_nanos
    spend = ledger.nanos
    crossed = next((t for t, total in ledger.cumulative if total >= cap), None)
    # what the gates knew just before the true spend reached the cap
    before = [row for row in load["samples"] if crossed is None or row[0] <= crossed]
    _, _, view_at_cap, held_at_cap = before[-1] if before else (0, 0, 0, 0)
    if crossed is None:
        in_flight_at_cap = admitted_after_cap = []
    else:
        in_flight_at_cap = [c for c in ledger.calls if c[0] < crossed <= c[1]]
        admitted_after_cap = [c for c in ledger.calls if c[0] >= crossed]
    served_tokens = {name: ledger.tokens[name] for name in TOKEN_FIELDS}
    upstream_tokens = upstream.get("usage", {})
    costs = [c[2] for c in ledger.calls]
    out: dict[str, Any] = {
        "spend_usd": spend / NANOS,
        "overshoot_usd": (spend - cap) / NANOS,
        "overshoot_pct": round((spend - cap) / cap * 100, 3),
        "calls": load["calls"],
        "refusals": load["refusals"],
        "errors": load["errors"],
        "statuses": load["statuses"],
        "stopped_by": load["stopped_by"],
        "stopped_at_s": load["stopped_at_s"],
        "seconds_to_cap": None if crossed is None else round(crossed, 2),
        "cost_per_call_usd_median": statistics.median(costs) / NANOS if costs else None,
        "spend_rate_usd_per_s": (
            round(spend / NANOS / ledger.cumulative[-1][0], 4) if ledger.cumulative else None
        ),
        "where_the_overshoot_comes_from": {
            # calls already streaming when the true spend reached the cap, and their cost
            "in_flight_at_cap_calls": len(in_flight_at_cap),
            "in_flight_at_cap_cost_usd": sum(c[2] for c in in_flight_at_cap) / NANOS,
            # calls a gate let through after that moment (what a gate could have refused)
            "admitted_after_cap_calls": len(admitted_after_cap),
            "admitted_after_cap_cost_usd": sum(c[2] for c in admitted_after_cap) / NANOS,
            # the last sample before the cap was reached: the spend the gates saw, and what
            # they held (ours, all replicas) or had not flushed yet (baseline)
            "gate_view_before_cap_usd": view_at_cap / NANOS,
            "held_or_unflushed_before_cap_usd": held_at_cap / NANOS,
        },
        "ground_truth": {
            "verdict_spend_usd": None if verdict is None else verdict["spent_nanos"] / NANOS,
            "verdict_state": None if verdict is None else verdict["state"],
            "verdict_equals_ground_truth": verdict is not None and verdict["spent_nanos"] == spend,
            "upstream_requests": upstream.get("requests"),
            "upstream_tokens_equal_metered": all(
                upstream_tokens.get(name) == served_tokens[name] for name in TOKEN_FIELDS
            ),
            "estimated_events": ledger.estimated,
        },
        "event_loop_lag_ms": {
            "p50": round(pct(load["loop_lag_ms"], 0.5), 1),
            "p99": round(pct(load["loop_lag_ms"], 0.99), 1),
        },
        **_timeline(kind, ledger, load["samples"]),
    }
    if kind.startswith("ours"):
        out.update(_enforcer_figures(probes, verdict_lag_ms, enforcer_replicas))
    else:
        out["flush_interval_s"] = opts.flush_interval_s
        out["flushes"] = polls[0].shared.flushes if polls else 0
    return out


def _timeline(kind: str, ledger: Ledger, samples: list[Any]) -> dict[str, Any]:
    """The phase sample by sample: the true spend, what the gates saw and held (ours) or had
    not flushed (baseline), and the calls in flight."""
    return {
        "timeline_columns": [
            "seconds",
            "true_spend_usd",
            "gate_view_usd",
            "held_usd" if kind.startswith("ours") else "unflushed_usd",
            "in_flight",
        ],
        "timeline": [
            [
                round(t, 2),
                total / NANOS,
                view / NANOS,
                held / NANOS,
                sum(1 for start, end, _ in ledger.calls if start <= t < end),
            ]
            for t, total, view, held in samples
        ],
    }


def _enforcer_figures(
    probes: list[EstimateProbe], verdict_lag_ms: list[float], enforcer_replicas: int | None
) -> dict[str, Any]:
    """Ours only: the enforcers' decisions, how their holds' estimates compare with the
    actual cost, and how late the verdicts came."""
    ratios = [est / actual for est, actual in (p for g in probes for p in g.pairs) if actual]
    decisions: dict[str, int] = {}
    for probe in probes:
        for name, n in probe.decisions.items():
            decisions[name] = decisions.get(name, 0) + n
    return {
        "enforcer_replicas": enforcer_replicas,
        "decisions": decisions,
        "hold_estimate_to_actual_cost": {
            "median": round(statistics.median(ratios), 3) if ratios else None,
            "min": round(min(ratios), 3) if ratios else None,
        },
        "verdict_lag_ms": {
            "p50": round(pct(verdict_lag_ms, 0.5), 1) if verdict_lag_ms else None,
            "p99": round(pct(verdict_lag_ms, 0.99), 1) if verdict_lag_ms else None,
            "verdicts": len(verdict_lag_ms),
        },
    }


def draw_chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap = result["cap_usd"]
    panels = []
    if result.get("ours"):
        panels.append(("ours", f"spendbus: reserve-and-settle, replicas={result['replicas']}"))
    if result.get("baseline"):
        every = result["baseline"]["flush_interval_s"]
        panels.append(("baseline", f"baseline: flush + poll every {every:g} s"))
    if "ours_unshared" in result.get("comparisons", {}):
        panels.append(("ours_unshared", "spendbus, replicas=1: per-process holds only"))
    if result.get("scaling"):
        plan = "→".join(str(n) for n in result["scaling"]["scaling_plan"]["replicas"])
        panels.append(("scaling", f"spendbus, membership: replicas {plan}"))
    if not panels:
        return
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6 * len(panels), 4.5), sharey=True, squeeze=False
    )
    for ax, (kind, title) in zip(axes[0], panels, strict=True):
        phase = result[kind] if kind in result else result["comparisons"][kind]
        t = [row[0] for row in phase["timeline"]]
        ax.plot(t, [row[1] for row in phase["timeline"]], label="true spend (served calls)", lw=2)
        view = "verdict spend (enforcer)" if kind != "baseline" else "shared total (cached)"
        ax.plot(t, [row[2] for row in phase["timeline"]], label=view, lw=1, ls="--")
        if kind != "baseline":
            ax.plot(
                t,
                [row[2] + row[3] for row in phase["timeline"]],
                label="verdict + holds of all replicas",
                lw=1,
                ls=":",
            )
        ax.axhline(cap, color="red", lw=1, label=f"cap ${cap:g}")
        ax.set_title(
            f"{title}\nspend ${phase['spend_usd']:.3f}, overshoot {phase['overshoot_pct']:+.2f}%",
            fontsize=10,
        )
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes[0][0].set_ylabel("USD")
    fig.suptitle(
        f"{result['clients']} streaming clients, {result['replicas']} gateway replicas, one ${cap:g} budget",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def result_of(opts: Options, phases: dict[str, Any]) -> dict[str, Any]:
    """The bench's JSON from the phases run (any of them may be left out)."""
    ours = phases["ours"]["overshoot_pct"] if "ours" in phases else None
    base = phases["baseline"]["overshoot_pct"] if "baseline" in phases else None
    ratio = max(ours, 0.0) / base if ours is not None and base is not None and base > 0 else None
    unshared = phases.get("ours_unshared")
    scaling = phases.get("scaling")
    return {
        "bench": "overshoot",
        "clients": opts.clients,
        "replicas": opts.replicas,
        "cap_usd": float(opts.cap_usd),
        "workload": {
            "api": "anthropic-messages (streamed)",
            "model": MODEL,
            "max_tokens": opts.max_tokens,
            "prompt_tokens": list(opts.prompt_tokens),
            "upstream_latency_ms": opts.latency_ms,
            "upstream_chunk_latency_ms": opts.chunk_latency_ms,
            "refusal_pause_ms": opts.refusal_pause_ms,
            "stop_after_refusals_per_replica": opts.stop_after_refusals,
            "stop_quiet_s": opts.quiet_s,
        },
        "ours": phases.get("ours"),
        "baseline": phases.get("baseline"),
        # the replicas count themselves while the fleet scales (membership)
        "scaling": scaling,
        # the enforcer without the replicas option (each replica may fill the whole headroom)
        "comparisons": {k: v for k, v in phases.items() if k == "ours_unshared"},
        "ratio_ours_to_baseline_overshoot": None if ratio is None else round(ratio, 4),
        "ratio_ours_unshared_to_baseline_overshoot": (
            round(max(unshared["overshoot_pct"], 0.0) / base, 4)
            if unshared is not None and base is not None and base > 0
            else None
        ),
        "targets": {
            "ours_overshoot_le_1pct": None if ours is None else ours <= 1.0,
            "ours_le_baseline_over_20": None if ratio is None else ratio <= 1 / 20,
            "scaling_overshoot_le_1pct": (
                None if scaling is None else scaling["overshoot_pct"] <= 1.0
            ),
            "ground_truth_equals_verdict": all(
                phase["ground_truth"]["verdict_equals_ground_truth"] for phase in phases.values()
            ),
        },
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
