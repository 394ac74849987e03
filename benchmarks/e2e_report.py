"""The tables and plots of ``bench_e2e.py``: per engine the first batch, median, p90 and bytes
per batch with ratios against RocksDB, the catalog's work per batch, the targets of issue 12,
the Connect engine against the classic one, and the partitions summary."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from pathlib import Path
from typing import Any

BASELINE = "spark-rocksdb"
PANDAS = "applyInPandasWithState"
CONNECT = "state_runtime-connect"


def figures(rounds: list[dict[str, Any]], batches: int) -> dict[str, float]:
    """First batch (builds the state), median and p90 of the update batches, bytes per batch;
    with several rounds, the update batches of all rounds pooled and the medians of the rest.
    For our engines also the catalog's work (see the module docstring)."""
    updates = [x for r in rounds for x in r["latencies"][1:]]

    def grown(r: dict[str, Any]) -> float:
        sizes = {int(k): v for k, v in r["sizes"].items()}
        first = sizes.get(1, sizes.get(min(sizes)) if sizes else 0)
        return float(r["final_bytes"] - first) / max(1, batches - 1)

    found = {
        "first": statistics.median(r["latencies"][0] for r in rounds),
        "median": statistics.median(updates),
        "p90": sorted(updates)[int(0.9 * (len(updates) - 1))],
        "bytes": statistics.median(grown(r) for r in rounds),
    }
    txns = [t for r in rounds for t in r.get("txns_per_batch", [])[1:]]
    if txns:
        found["txns"] = statistics.median(txns)
        found["txns_max"] = max(txns)
    if any("pg_xact_per_batch" in r for r in rounds):
        found["pg_xact"] = statistics.median(r["pg_xact_per_batch"] for r in rounds)
        found["pg_peak"] = max(r["pg_peak_connections"] for r in rounds)
    return found


def _empty_delta_bytes() -> int:
    """The bytes of a format 3 delta holding no row: the fixed cost of one file."""
    import numpy as np
    from bench_delta_bytes import sizes

    empty = np.array([], dtype=np.int64)
    return sizes(0, empty, empty)[1]


def _catalog_cells(f: dict[str, float]) -> str:
    txns = f"{f['txns']:.0f} (max {f['txns_max']:.0f})" if "txns" in f else ""
    xact = f"{f['pg_xact']:.1f}" if "pg_xact" in f else ""
    peak = f"{f['pg_peak']:.0f}" if "pg_peak" in f else ""
    return f"{txns} | {xact} | {peak}"


def report(
    results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, partitions: int
) -> None:
    print(
        f"\nmachine: {os.cpu_count()} cores, {platform.machine()}, Python "
        f"{platform.python_version()}, load {os.getloadavg()[0]:.2f} at the end; local[2], "
        f"{partitions} partitions, {args.keys:,} keys, {args.updates:,} updates/batch, "
        f"{args.batches} batches, {args.rounds} round(s)"
    )
    rows = {engine: figures(r, args.batches) for engine, r in results.items()}
    base = rows.get(BASELINE)
    print(
        "\n| engine | first batch | median | p90 | bytes per batch "
        f"| vs {BASELINE} (median, p90, bytes) | catalog txns per batch (driver) "
        "| PG xact_commit per batch (all processes) | peak PG connections |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for engine, f in rows.items():
        ratio = (
            ""
            if base is None
            else (
                f"{f['median'] / base['median']:.2f}x, {f['p90'] / base['p90']:.2f}x, "
                f"{f['bytes'] / base['bytes']:.2f}x"
            )
        )
        print(
            f"| {engine} | {f['first']:.2f} s | {f['median']:.2f} s | {f['p90']:.2f} s "
            f"| {f['bytes'] / 1024:.1f} KiB | {ratio} | {_catalog_cells(f)} |"
        )
    mine = [label for label in rows if label.split("[")[0] == "state_runtime"]
    ours_row = rows[mine[0]] if mine else None
    connect = next((rows[label] for label in rows if label.startswith(CONNECT)), None)
    if ours_row is not None and connect is not None:
        median, p90 = connect["median"] / ours_row["median"], connect["p90"] / ours_row["p90"]
        print(
            f"\n{CONNECT} vs state_runtime (classic) in this run: median {median:.2f}x, "
            f"p90 {p90:.2f}x; target median <= 1.2x -> {'met' if median <= 1.2 else 'NOT met'}"
        )
    for label in mine:
        f = rows[label]
        print(f"\ntargets, {label} in this run:")
        if base is not None:
            for what, value, goal in (
                ("median <= 0.8x RocksDB's (stretch 0.5x)", f["median"] / base["median"], 0.8),
                ("p90 <= RocksDB's p90", f["p90"] / base["p90"], 1.0),
                ("bytes <= 1/3 of RocksDB's", f["bytes"] / base["bytes"], 1 / 3),
            ):
                print(f"  {what}: {value:.2f}x -> {'met' if value <= goal else 'NOT met'}")
            stores = min(partitions, args.updates)  # each changed store writes one delta
            floor = stores * _empty_delta_bytes()
            print(
                f"  (one delta per changed store: {stores} files x {_empty_delta_bytes()} B "
                f"before any row = {floor / 1024:.1f} KiB; 1/3 of RocksDB's is "
                f"{base['bytes'] / 3 / 1024:.1f} KiB)"
            )
        if "txns" in f:
            print(
                f"  catalog transactions per batch <= 3: {f['txns_max']:.0f} -> "
                f"{'met' if f['txns_max'] <= 3 else 'NOT met'}"
            )
        if PANDAS in rows:
            speedup = rows[PANDAS]["median"] / f["median"]
            print(
                f"  >= 10x faster than {PANDAS} (median): {speedup:.1f}x -> "
                f"{'met' if speedup >= 10 else 'NOT met'}"
            )
        warm = results[label][0].get("warm", [])[1:]  # the first round's
        if warm:
            hits = statistics.mean(w["hit_rate"] for w in warm)
            loads = [w["max_load_ms"] for w in warm]
            print(
                f"  warm copies (update batches of round 1): cache hit rate {hits:.0%}; "
                f"slowest load per batch: median {statistics.median(loads):.0f} ms, "
                f"max {max(loads):.0f} ms"
            )


def summary(results: dict[int, dict[str, list[dict[str, Any]]]], args: argparse.Namespace) -> None:
    """One line per (partitions, engine) and a plot of median and transactions per batch."""
    print(
        "\n| partitions | engine | median | p90 | bytes per batch | median vs RocksDB "
        "| txns per batch (driver) | PG xact per batch | peak PG connections |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    table: dict[str, list[tuple[int, dict[str, float]]]] = {}
    for partitions, found in sorted(results.items()):
        rows = {engine: figures(r, args.batches) for engine, r in found.items()}
        base = rows.get(BASELINE)
        for engine, f in rows.items():
            ratio = "" if base is None else f"{f['median'] / base['median']:.2f}x"
            print(
                f"| {partitions} | {engine} | {f['median']:.2f} s | {f['p90']:.2f} s "
                f"| {f['bytes'] / 1024:.1f} KiB | {ratio} | {_catalog_cells(f)} |"
            )
            table.setdefault(engine, []).append((partitions, f))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    for engine, points in table.items():
        xs = [x for x, _ in points]
        ax1.plot(xs, [f["median"] for _, f in points], marker="o", label=engine)
        ax2.plot(xs, [f["bytes"] / 1024 for _, f in points], marker="o", label=engine)
        if all("pg_xact" in f or "txns" in f for _, f in points):
            counted = [f.get("pg_xact", f.get("txns", 0.0)) for _, f in points]
            ax3.plot(xs, counted, marker="o", label=engine)
    ax1.set(title="median batch time", xlabel="partitions", ylabel="seconds")
    ax2.set(title="checkpoint bytes per batch", xlabel="partitions", ylabel="KiB")
    ax3.set(
        title="catalog transactions per batch\n(PG: xact_commit, else driver)",
        xlabel="partitions",
        ylabel="transactions",
    )
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = str(Path(args.plot).with_name(Path(args.plot).stem + "-partitions.png"))
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


def plot(results: dict[str, list[dict[str, Any]]], path: str) -> None:
    """Batch latency and state folder growth per engine (its first round)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for engine, rounds in results.items():
        r = rounds[0]
        lat = r["latencies"][1:]
        ax1.plot(range(1, len(lat) + 1), lat, marker=".", label=engine)
        sizes = sorted((int(k), v) for k, v in r["sizes"].items())
        ax2.plot(
            [k for k, _ in sizes], [v / 1024 / 1024 for _, v in sizes], marker=".", label=engine
        )
    ax1.set(title="batch latency (update batches)", xlabel="batch", ylabel="seconds")
    ax1.set_yscale("log")
    ax2.set(title="state checkpoint folder size", xlabel="batch", ylabel="MiB")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"\nplot: {path}")


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def processes_report(
    results: dict[str, list[dict[str, Any]]], state_bytes: int, budget: str | None
) -> None:
    """Each engine's processes: the peak resident memory of each Python worker and of the
    JVM, the bytes read and written (block device, and every call), the first batch after a
    restart; for ours the local-disk figures of its last batch."""
    print(
        f"\nstate: {_mib(state_bytes)} (16 bytes a key); STATE_CACHE_BYTES: "
        f"{_mib(int(budget)) + ' per Python worker' if budget else 'default'}"
    )
    for engine, runs in results.items():
        for r in runs:
            for when, key in (("run", "processes"), ("restart", "restart_processes")):
                for kind, p in sorted(r.get(key, {}).items()):
                    if not max(p["peak_rss"]) >> 20:
                        continue  # scripts and tools, not an engine's process
                    peaks = ", ".join(_mib(x) for x in sorted(p["peak_rss"], reverse=True)[:6])
                    anon = ", ".join(_mib(x) for x in sorted(p["peak_anon"], reverse=True)[:6])
                    print(
                        f"  {engine} {when} {kind} x{len(p['peak_rss'])}: peak RSS {peaks} "
                        f"(anonymous, sampled: {anon}); "
                        f"disk read {_mib(p['read_bytes'])}, written {_mib(p['write_bytes'])}; "
                        f"read calls {_mib(p['rchar'])}, write calls {_mib(p['wchar'])}"
                    )
            if r.get("restart"):
                print(f"  {engine} first batch after a restart: {r['restart'][0]:.2f} s")
            warm = r.get("warm", [])
            if warm and "local_disk_bytes" in warm[-1]:
                last = warm[-1]
                print(
                    f"  {engine} last batch: resident {_mib(last['resident_bytes'])}, local disk "
                    f"{_mib(last['local_disk_bytes'])}; over the update batches: compaction "
                    f"{_mib(sum(w['compaction_bytes'] for w in warm[1:]))}, block cache hits "
                    f"{sum(w['block_cache_hits'] for w in warm[1:])}, misses "
                    f"{sum(w['block_cache_misses'] for w in warm[1:])}"
                )
    rows = {e: runs[0] for e, runs in results.items() if runs[0].get("restart")}
    base = rows.get(BASELINE)
    for engine, r in rows.items():
        if base is not None and engine != BASELINE:
            ratio = r["restart"][0] / base["restart"][0]
            print(
                f"  target first batch after a restart <= 0.5x RocksDB's: {ratio:.2f}x -> "
                f"{'met' if ratio <= 0.5 else 'NOT met'}"
            )
    if budget:
        limit = int(budget) + (200 << 20)
        for engine, r in results.items():
            workers = r[0].get("processes", {}).get("python_worker")
            if workers and engine != BASELINE:
                peak = max(workers["peak_rss"])
                print(
                    f"  target worker peak RSS <= budget + 200 MiB ({_mib(limit)}): {_mib(peak)}"
                    f" -> {'met' if peak <= limit else 'NOT met'}"
                )
