"""How long evaluating the program takes under the mock engine, and how deep its graph is,
for 2, 10, 50 and 100 workers. Goal: 100 workers in under 3 s on a 2-core machine, and a graph
depth that does not grow with the worker count (workers join in parallel).

    .venv/bin/python bench/render_scaling.py
"""

from __future__ import annotations

import ipaddress
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.tools.offline import lab_config_from_stack, run_program
from components.tools.render import graph_depth

WORKER_COUNTS = (2, 10, 50, 100)
REPEATS = 3
GOAL_SECONDS = 3.0


def nodes_with_workers(count: int) -> dict:
    lab = lab_config_from_stack("labs")
    taken = {n.ip for n in lab.all_nodes} | {lab.load_balancer.vip, lab.network.gateway}
    free = (ip for ip in lab.network.cidr.hosts() if ip not in taken and ip > ipaddress.IPv4Address("10.3.60.56"))
    nodes = lab.nodes.model_dump(by_alias=True, mode="json")
    nodes["workers"]["hosts"] = [{"name": f"labs-k8s-w{i:03d}", "ip": str(next(free))} for i in range(1, count + 1)]
    return nodes


def main() -> int:
    print(f"{'workers':>8} {'resources':>10} {'depth':>6} {'median s':>9} {'min s':>7}")
    depths = []
    worst = 0.0
    for count in WORKER_COUNTS:
        overrides = {"labs-k8s:nodes": nodes_with_workers(count)}
        timings = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            run = run_program("labs", overrides=overrides)
            timings.append(time.perf_counter() - start)
        depth = graph_depth(run)
        depths.append(depth)
        median = statistics.median(timings)
        worst = max(worst, median) if count == WORKER_COUNTS[-1] else worst
        print(f"{count:>8} {len(run.registrations):>10} {depth:>6} {median:>9.2f} {min(timings):>7.2f}")
    flat = len(set(depths)) == 1
    print(
        f"goal: {WORKER_COUNTS[-1]} workers under {GOAL_SECONDS:.1f} s: {'met' if worst < GOAL_SECONDS else 'MISSED'}"
        f" ({worst:.2f} s); depth independent of worker count: {'yes' if flat else 'NO'} ({depths})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
