"""Balancer failover figures: the network-namespace lab of tests/netns_lab.py, measured.

Runs every scenario of the lab (the shipped FAULT-mode Keepalived config) a few rounds, plus two
comparisons: the weight mode (a failing check lowers the priority instead of FAULT) for a dead
HAProxy, and an apiserver killed with SIGKILL instead of SIGTERM. Prints one table row per
scenario: how long until the VIP answered again, failed client requests (polling every 100 ms),
the VRRP bound and the goal. Needs root (network namespaces), haproxy, keepalived, openssl.

    sudo .venv/bin/python bench/lb_failover.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.rendering import lb
from tests import netns_lab
from tests.labs import make_lab_config
from tests.netns_lab import NetnsLab, ScenarioResult

WEIGHT = -(lb.MASTER_PRIORITY - lb.BACKUP_PRIORITY + 10)


@dataclass
class Row:
    name: str
    bound: float | None
    goal: str
    results: list[ScenarioResult] = field(default_factory=list)

    def times(self) -> list[float]:
        return [r.recovered_after for r in self.results if r.recovered_after is not None]

    def verdict(self) -> str:
        if not self.results:
            return "n/a"
        dual = sum(r.dual_vip_samples for r in self.results)
        if self.goal.startswith("0 failed"):
            ok = all(r.failed == 0 for r in self.results)
        else:
            limit = float(self.goal.split()[1])
            times = self.times()
            ok = len(times) == len(self.results) and max(times) <= limit
        return "ok" if ok and dual == 0 else "MISSED"


def _fmt_times(times: list[float]) -> str:
    if not times:
        return "never"
    if len(times) == 1:
        return f"{times[0]:.2f}"
    return f"{min(times):.2f} / {statistics.median(times):.2f} / {max(times):.2f}"


def print_table(rows: list[Row], probe_interval: float) -> None:
    headers = [
        "scenario",
        "runs",
        "VIP answers again, s (min/med/max)",
        "failed requests",
        "VRRP bound, s",
        "goal",
        "VIP on both",
        "failback failed",
        "verdict",
    ]
    table = [headers]
    for row in rows:
        table.append(
            [
                row.name,
                str(len(row.results)),
                _fmt_times(row.times()),
                " ".join(str(r.failed) for r in row.results),
                "-" if row.bound is None else f"{row.bound:.2f}",
                row.goal,
                " ".join(str(r.dual_vip_samples) for r in row.results),
                " ".join("-" if r.failback_failed is None else str(r.failback_failed) for r in row.results),
                row.verdict(),
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
    for index, line in enumerate(table):
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))
    print(
        f"\nclient: TLS GET /healthz through the VIP every {probe_interval * 1000:.0f} ms, 1 s timeout; "
        "'failed requests' and 'VIP on both' are per run."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each shipped scenario (default 3)")
    parser.add_argument("--compare-rounds", type=int, default=2, help="runs of each comparison (default 2)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("lb_failover: needs root (it builds network namespaces); run it with sudo", file=sys.stderr)
        return 2

    cfg = make_lab_config()
    vrrp = netns_lab.vrrp_bound(cfg)
    fault_bound = netns_lab.haproxy_dead_bound(cfg)
    rows = {
        "baseline": Row("baseline: VIP on lb1, round robin", None, "0 failed"),
        "haproxy": Row("HAProxy killed on lb1", fault_bound, "<= 2.5 s"),
        "frozen": Row("lb1 frozen (SIGSTOP)", vrrp, "<= 3.7 s"),
        "link": Row("lb1 link down (lost)", vrrp, "<= 3.7 s"),
        "apiserver": Row("apiserver m01 stopped (SIGTERM)", None, "0 failed"),
        "apiserver-kill": Row("apiserver m01 killed (SIGKILL)", None, "0 failed"),
        "weight": Row(
            f"HAProxy killed on lb1, weight {WEIGHT} instead of FAULT",
            lb.CHECK_FALL * lb.CHECK_INTERVAL_SECONDS + vrrp,
            "<= 2.5 s",
        ),
    }
    notes: list[str] = []
    started = time.monotonic()
    with NetnsLab(cfg) as lab:
        for _ in range(args.rounds):
            rows["baseline"].results.append(netns_lab.scenario_baseline(lab))
            rows["haproxy"].results.append(netns_lab.scenario_haproxy_dead(lab))
            frozen = netns_lab.scenario_frozen(lab)
            rows["frozen"].results.append(frozen)
            notes.append(
                f"frozen: VIP still configured on the frozen lb1 in {frozen.frozen_dual_samples} samples, "
                f"cleared {frozen.observed.get('stale_vip_after_thaw_s')} s after the thaw"
            )
            rows["link"].results.append(netns_lab.scenario_link_down(lab))
            rows["apiserver"].results.append(netns_lab.scenario_apiserver_dead(lab, "m01", signal.SIGTERM))
        for _ in range(args.compare_rounds):
            rows["apiserver-kill"].results.append(netns_lab.scenario_apiserver_dead(lab, "m01", signal.SIGKILL))
        for result in rows["apiserver"].results + rows["apiserver-kill"].results:
            notes.append(f"{result.name}: {'; '.join(result.notes)}")
    if args.compare_rounds:
        with NetnsLab(cfg, script_weight=WEIGHT) as lab:
            for _ in range(args.compare_rounds):
                rows["weight"].results.append(netns_lab.scenario_haproxy_dead(lab))
    elapsed = time.monotonic() - started

    print_table([row for row in rows.values() if row.results], 0.1)
    print(
        f"VRRP bound: 3 x advert_int ({cfg.load_balancer.advert_int_seconds} s) + skew, skew = (256 - "
        f"{lb.BACKUP_PRIORITY}) / 256 s; for a dead HAProxy (FAULT mode): fall {lb.CHECK_FALL} x interval "
        f"{lb.CHECK_INTERVAL_SECONDS} s + skew."
    )
    for note in notes:
        print(f"  {note}")
    print(f"({elapsed:.0f} s)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {key: [vars(r) | {"backends": dict(r.backends)} for r in row.results] for key, row in rows.items()},
                indent=2,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
