"""The lab in a box's figures (docs/testing.md, "The lab in a box"). Needs root, as `make test` does.

For the default lab and for 10 workers, on the real CLI, language host and plugins against vcsim,
with every clone a host of the box (tests/lab_box.py), prints:
- the wall time of `make up` from empty to verify-cluster, with the template built (the stand-in
  ISO, so seconds) and reused (kept by `template.retainOnDestroy` across `make destroy`):
  `make up LAYER=vsphere`, the hosts' first boot, then `make up` of the whole graph at parallelism
  16 (the vSphere half at 1: tests/pulumi_engine.py VCSIM_PARALLEL);
- the length of its critical path: the longest chain of step durations (each resource's
  resourcePreEvent -> resOutputsEvent in the engine's `--event-log`) along the dependencies the
  state records (`pulumi stack export`), plus the boot the steps wait for;
- the engine's own overhead: wall time minus the critical path;
- the wall time of a no-change `make up`;
- the time from the VIP holder's power-off in vcsim to the VIP answering again from the other
  balancer.
Goals (issue #31): `make up` from empty under 5 minutes, engine overhead under 20 % of its wall time.

    sudo .venv/bin/python bench/lab_box.py
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_lab_box import balancer_failover, open_box


def step_spans(events: list[dict[str, Any]]) -> dict[str, float]:
    """URN -> seconds from its resourcePreEvent to its resOutputsEvent (or failure)."""
    starts: dict[str, float] = {}
    spans: dict[str, float] = {}
    for event in events:
        stamp = float(event.get("timestamp", 0))
        for kind in ("resourcePreEvent", "resOutputsEvent", "resOpFailedEvent"):
            body = event.get(kind)
            # Only what a provider does: a component's (and the stack's) events span all of its
            # children, so counting them along the parent edges would count the children twice.
            if isinstance(body, dict) and body.get("metadata", {}).get("provider"):
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


def cli_duration(output: str) -> float:
    """The CLI's own `Duration:` of an update (whole seconds), from its last summary."""
    found = re.findall(r"^Duration: (?:(\d+)m)?(\d+)s$", output, flags=re.MULTILINE)
    minutes, seconds = found[-1] if found else ("", "0")
    return 60 * int(minutes or 0) + int(seconds)


def timed_up(lab: Any, hosts: Any) -> tuple[float, float, float, float]:
    """`make up` from no VM: the vSphere half (at vcsim's parallelism of 1), the hosts' first boot,
    then `make up` of the whole graph at the CLI's default-like parallelism (nothing of the vSphere
    half changes then, so vcsim's property collector is not in the way: tests/pulumi_engine.py
    VCSIM_PARALLEL). Returns the wall time, the critical path, the boot, and the time outside the
    CLI's updates (make's preflight checks, the preview `make up` shows first, the CLI's start)."""
    started = time.monotonic()
    vsphere = lab.make("up", layer="vsphere", args="--yes", timeout=1800)
    assert vsphere.ok, vsphere.output[-3000:]
    vsphere_s = time.monotonic() - started
    boot = hosts.wait_booted([h.name for h in hosts.hosts.values()], timeout=900)
    steps_started = time.monotonic()
    steps = lab.make("up", args="--yes --parallel 16", timeout=3600)
    assert steps.ok, steps.output[-3000:]
    steps_s = time.monotonic() - steps_started
    wall = time.monotonic() - started
    spans = {**step_spans(vsphere.event_log()), **step_spans(steps.event_log())}
    path = critical_path(spans, lab.stack_export()["deployment"]["resources"]) + boot
    outside = vsphere_s + steps_s - cli_duration(vsphere.output) - cli_duration(steps.output)
    return wall, path, boot, outside


def measure(label: str, root: Path, workers: list[tuple[str, str]] | None) -> None:
    with open_box(root, workers) as box:
        lab, hosts = box.lab, box.hosts
        # Kept across `make destroy`, so the second `make up` reuses it (docs/runbook.md).
        lab.pulumi("config", "set", "--stack", lab.stack, "--path", "labs-k8s:template.retainOnDestroy", "true")
        for run in ("template built", "template reused"):
            wall, path, boot, outside = timed_up(lab, hosts)
            print(f"{label}: make up from empty ({run}), to verify-cluster: {wall:.1f} s")
            print(f"{label}:   critical path (steps along their dependencies, plus boot {boot:.1f} s): {path:.1f} s")
            overhead = wall - path
            print(f"{label}:   engine overhead (wall minus critical path): {overhead:.1f} s ({overhead / wall:.0%})")
            beside = "make's checks, its preview, the CLI's start"
            print(f"{label}:     of which outside the CLI's updates ({beside}): {outside:.1f} s")
            if run == "template built":
                started = time.monotonic()
                again = lab.make("up", args="--yes", timeout=1800)
                assert again.ok and again.summary() == {}, again.output[-3000:]
                print(f"{label}: make up with no change: {time.monotonic() - started:.1f} s")
                failover = balancer_failover(box)
                moved = failover["answered_after_s"]
                print(f"{label}: VIP holder powered off -> VIP answers from the other balancer: {moved} s")
            destroyed = lab.make("destroy", args="--yes", timeout=1800)
            assert destroyed.ok, destroyed.output[-3000:]


def main() -> int:
    # Kept (its artifacts are the CLI's output of every run): a failed run is looked into there.
    work = tempfile.mkdtemp(prefix="labs-k8s-bench-")
    print(f"bench: the boxes' artifacts are kept under {work}", flush=True)
    measure("default lab (7 VMs)", Path(work) / "default", None)
    ten = [(f"labs-k8s-w{i:02d}", f"10.3.60.{109 + i}") for i in range(1, 11)]
    measure("10 workers (15 VMs)", Path(work) / "ten", ten)
    return 0


if __name__ == "__main__":
    sys.exit(main())
