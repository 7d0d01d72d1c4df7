"""The lab in a box's figures (docs/testing.md, "The lab in a box"). Needs root, as `make test` does.

For the default lab and for 10 workers, on the real CLI, language host and plugins against vcsim,
with every clone a host of the box (tests/lab_box.py), prints:
- the wall time of `make up` from empty, as far as the box runs it today: `make up LAYER=vsphere`
  (the template built with the stand-in ISO, so seconds), the hosts' first boot, then `up` of the
  fleet's and the balancers' steps (host keys, readiness, node settings, HAProxy and Keepalived)
  at the CLI's default parallelism (the vSphere half at 1: tests/pulumi_engine.py VCSIM_PARALLEL);
- the length of its critical path: the longest chain of step durations (each resource's
  resourcePreEvent -> resOutputsEvent in the engine's `--event-log`) along the dependencies the
  state records (`pulumi stack export`), plus the boot the steps wait for;
- the engine's own overhead: wall time minus the critical path;
- the wall time of a no-change `preview --expect-no-changes` of the same targets;
- the time from the VIP holder's power-off in vcsim to the VIP answering again from the other
  balancer.
Goals (issue #31): `make up` from empty under 5 minutes, engine overhead under 20 % of its wall time.

    sudo .venv/bin/python bench/lab_box.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_lab_box import balancer_failover, open_box, targets


def step_spans(events: list[dict[str, Any]]) -> dict[str, float]:
    """URN -> seconds from its resourcePreEvent to its resOutputsEvent (or failure)."""
    starts: dict[str, float] = {}
    spans: dict[str, float] = {}
    for event in events:
        stamp = float(event.get("timestamp", 0))
        for kind in ("resourcePreEvent", "resOutputsEvent", "resOpFailedEvent"):
            body = event.get(kind)
            if isinstance(body, dict):
                urn = str(body.get("metadata", {}).get("urn", ""))
                if kind == "resourcePreEvent":
                    starts[urn] = stamp
                elif urn in starts:
                    spans[urn] = spans.get(urn, 0.0) + stamp - starts.pop(urn)
    return spans


def critical_path(spans: dict[str, float], resources: list[dict[str, Any]]) -> float:
    """The longest chain of durations along each resource's recorded dependencies and parent."""
    needs = {r["urn"]: [*r.get("dependencies", []), *([r["parent"]] if r.get("parent") else [])] for r in resources}
    longest: dict[str, float] = {}

    def finish(urn: str) -> float:
        if urn not in longest:
            longest[urn] = 0.0  # a cycle guard; the state has none
            longest[urn] = spans.get(urn, 0.0) + max((finish(d) for d in needs.get(urn, [])), default=0.0)
        return longest[urn]

    return max((finish(urn) for urn in needs), default=0.0)


def measure(label: str, root: Path, workers: list[tuple[str, str]] | None) -> None:
    with open_box(root, workers) as box:
        lab, hosts = box.lab, box.hosts
        started = time.monotonic()
        vsphere = lab.make("up", layer="vsphere", args="--yes", timeout=1800)
        assert vsphere.ok, vsphere.output[-3000:]
        names = [h.name for h in hosts.hosts.values()]
        boot = hosts.wait_booted(names, timeout=900)
        # The steps at the CLI's default parallelism, as a user runs them: nothing of the vSphere
        # half changes here, so vcsim's property collector (tests/pulumi_engine.py VCSIM_PARALLEL)
        # is not in the way.
        steps = lab.engine("up", *targets(), timeout=3600, extra=("--parallel", "16"))
        assert steps.ok, steps.output[-3000:]
        wall = time.monotonic() - started
        spans = {**step_spans(vsphere.event_log()), **step_spans(steps.event_log())}
        path = critical_path(spans, lab.stack_export()["deployment"]["resources"]) + boot
        print(f"{label}: make up from empty (vSphere half, boot, fleet and balancer steps): {wall:.1f} s")
        print(f"{label}:   critical path (steps along their dependencies, plus the boot of {boot:.1f} s): {path:.1f} s")
        overhead = wall - path
        print(f"{label}:   engine overhead (wall minus critical path): {overhead:.1f} s ({overhead / wall:.0%})")
        started = time.monotonic()
        again = lab.engine("preview", *targets(), expect_no_changes=True)
        assert again.ok, again.output[-3000:]
        print(f"{label}: preview of the same targets, no change: {time.monotonic() - started:.1f} s")
        failover = balancer_failover(box)
        moved = failover["answered_after_s"]
        print(f"{label}: VIP holder powered off -> VIP answers from the other balancer: {moved} s")
        destroyed = lab.make("destroy", timeout=1800)
        assert destroyed.ok, destroyed.output[-3000:]


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        measure("default lab (7 VMs)", Path(work) / "default", None)
        ten = [(f"labs-k8s-w{i:02d}", f"10.3.60.{109 + i}") for i in range(1, 11)]
        measure("10 workers (15 VMs)", Path(work) / "ten", ten)
    return 0


if __name__ == "__main__":
    sys.exit(main())
