"""The lab in a box's figures (docs/testing.md, "The lab in a box"). Needs root, as `make test` does.

For the default lab and for 10 workers, on the real CLI, language host and plugins against vcsim,
with every clone a host of the box (tests/lab_box.py), prints:
- the wall time of `make up` from empty to verify-cluster, with the template built (the stand-in
  ISO, so seconds) and reused (kept by `template.retainOnDestroy` across `make destroy`): one
  `make up` as a user types it, at make's parallelism (PULUMI_PARALLEL=64, the Makefile says why;
  tests/pulumi_engine.py VCSIM_PARALLEL says why vcsim serves it);
- the length of its critical path: the longest chain of step durations (each resource's
  resourcePreEvent -> resOutputsEvent in the engine's `--event-log`, stamped as it is written:
  EventClock) along the dependencies the state records (`pulumi stack export`);
- the engine's own overhead: wall time minus the critical path, and where it goes: outside the
  CLI's update (make's preflight check, the preview `make up` shows first, the CLI's start and
  exit), in it with no step running (the program, registering and diffing, checkpoints), and in
  it with steps running but none of the critical path;
- the size of the state that `make up` left, which the file backend writes whole, and a copy of
  the last, at the start and the end of every step (pkg/backend/snapshot.go, one save at a time);
- the CPU time of `make up`'s processes (the CLI, its plugins, the program): on the box they share
  the machine's cores with the hosts (tests/lab_box.py hosts_cpu_group);
- the wall time of a no-change `make up`;
- the time from the VIP holder's power-off in vcsim to the VIP answering again from the other
  balancer.
Goals (issue #31): `make up` from empty under 5 minutes, engine overhead under 20 % of its wall time.

    sudo .venv/bin/python bench/lab_box.py [--lab default|ten]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine import busy
from tests.test_lab_box import balancer_failover, open_box


class EventClock:
    """Stamps each line of the engine's `--event-log` with the time it appears. The events' own
    `timestamp` is whole seconds (pkg/backend/display/display.go stampEvents: time.Now().Unix()),
    and most steps of the box take well under one; the CLI writes each event as it happens, so a
    poll every 10 ms places each within that. `pulumi up` opens the log once for its preview and
    again, truncating it (display.go: os.O_TRUNC), for the update: what is kept is the update's."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stamped: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._offset = 0
        self._partial = b""
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self) -> EventClock:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._failed is None:
            self._read()
        if self._failed is not None:
            raise self._failed
        summaries = [event["summaryEvent"] for _, event in self.stamped if "summaryEvent" in event]
        if "preludeEvent" not in self.stamped[0][1] or [s.get("isPreview") for s in summaries] != [False]:
            raise RuntimeError(f"{self.path}: what was followed is not one whole update, prelude to summary")

    def _read(self) -> None:
        try:
            with self.path.open("rb") as log:
                if os.fstat(log.fileno()).st_size < self._offset:  # truncated: the update begins
                    self._offset, self._partial, self.stamped = 0, b"", []
                log.seek(self._offset)
                chunk = log.read()
        except FileNotFoundError:
            return
        now = time.monotonic()
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in filter(bytes.strip, lines):
            try:
                self.stamped.append((now, json.loads(line)))
            except ValueError:
                raise RuntimeError(
                    f"{self.path}: a line that is not an event; the log was truncated and grew past "
                    "where it was read between two polls, so the stamps cannot be trusted"
                ) from None

    def _follow(self) -> None:
        try:
            while not self._stop.wait(0.01):
                self._read()
        except BaseException as failed:  # raised again by __exit__
            self._failed = failed

    def span(self) -> float:
        """From the update's first event (its prelude) to its summary."""
        return next(at for at, event in self.stamped if "summaryEvent" in event) - self.stamped[0][0]


def step_spans(stamped: list[tuple[float, dict[str, Any]]]) -> dict[str, tuple[float, float]]:
    """URN -> (start, end): its resourcePreEvent and its resOutputsEvent (or failure), for each
    step a provider did something in (not `same`: a VM the steps' update leaves as the vSphere half
    made it keeps the span of its clone)."""
    starts: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    for stamp, event in stamped:
        for kind in ("resourcePreEvent", "resOutputsEvent", "resOpFailedEvent"):
            body = event.get(kind)
            # Only what a provider does: a component's (and the stack's) events span all of its
            # children, so counting them along the parent edges would count the children twice.
            metadata = body.get("metadata", {}) if isinstance(body, dict) else {}
            if metadata.get("provider") and metadata.get("op") != "same":
                urn = str(metadata.get("urn", ""))
                if kind == "resourcePreEvent":
                    starts[urn] = stamp
                elif urn in starts:
                    spans[urn] = (starts.pop(urn), stamp)
    return spans


def critical_path(spans: dict[str, tuple[float, float]], resources: list[dict[str, Any]]) -> list[str]:
    """The longest chain of step durations along each resource's recorded dependencies and
    parent, first step first."""
    needs = {r["urn"]: [*r.get("dependencies", []), *([r["parent"]] if r.get("parent") else [])] for r in resources}
    longest: dict[str, tuple[float, list[str]]] = {}

    def duration(urn: str) -> float:
        start, end = spans.get(urn, (0.0, 0.0))
        return end - start

    def chain(urn: str) -> tuple[float, list[str]]:
        if urn not in longest:
            longest[urn] = (0.0, [])  # a cycle guard; the state has none
            length, before = max((chain(d) for d in needs.get(urn, [])), default=(0.0, []))
            longest[urn] = (length + duration(urn), [*before, urn] if urn in spans else before)
        return longest[urn]

    return max((chain(urn) for urn in needs), default=(0.0, []))[1]


def timed_up(lab: Any) -> dict[str, float]:
    """One `make up` from no VM to verify-cluster, as a user types it (make's parallelism,
    PULUMI_PARALLEL: tests/pulumi_engine.py VCSIM_PARALLEL). Returns its wall time, its critical path
    (the steps that wait for the first boot included), its overhead in the PARTS, which add up
    to wall minus path, the size of the state it left and how many steps it ran."""
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with EventClock(lab.next_make_events("up")) as clock:
        up = lab.make("up", args="--yes", timeout=3600, cli_parallel=True)
    wall = time.monotonic() - started
    # The make's process tree is the only child that ends meanwhile (the box's hosts and vcsim run on).
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    assert up.ok, up.output[-3000:]
    spans = step_spans(clock.stamped)
    deployment = lab.stack_export()["deployment"]
    chain = critical_path(spans, deployment["resources"])
    path = sum(end - start for urn, (start, end) in spans.items() if urn in chain)
    running = busy(list(spans.values()))
    # Where the critical path waited: each step's start and end from the update's first event (a
    # step's start minus the end of the one before it is the engine's share), beside the CLI's output.
    origin = clock.stamped[0][0]
    timeline = [
        {"step": urn.rsplit("::", 1)[1], "start": spans[urn][0] - origin, "end": spans[urn][1] - origin}
        for urn in chain
    ]
    (lab.artifacts / f"bench-up-{len(list(lab.artifacts.glob('bench-up-*')))}.json").write_text(
        json.dumps(
            {
                "wall": wall,
                "critical_path": timeline,
                "spans": {u: [a - origin, b - origin] for u, (a, b) in spans.items()},
            }
        )
    )
    # The file backend writes the whole state, and a copy of the last, at each step's start and end
    # (pkg/backend/snapshot.go SnapshotManager.mutate, one save at a time; diy/state.go saveCheckpoint).
    state_mb = len(json.dumps(deployment).encode()) / 1e6
    return {
        "state MB": state_mb,
        "steps": len(spans),
        "cpu": cpu,
        "wall": wall,
        "path": path,
        "outside": wall - clock.span(),
        "no step running": clock.span() - running,
        "off the path": running - path,
    }


# The parts of the overhead, as timed_up names them, and what each is.
PARTS = {
    "outside": "outside the CLI's update: make's preflight check, the preview `make up` shows, the CLI's start, exit",
    "no step running": "in the update, no step running: the program, registering and diffing resources, checkpoints",
    "off the path": "in the update, steps running but none of the critical path",
}


def measure(label: str, root: Path, workers: list[tuple[str, str]] | None) -> None:
    with open_box(root, workers) as box:
        lab = box.lab
        # Kept across `make destroy`, so the second `make up` reuses it (docs/runbook.md).
        lab.pulumi("config", "set", "--stack", lab.stack, "--path", "labs-k8s:template.retainOnDestroy", "true")
        for run in ("template built", "template reused"):
            figures = timed_up(lab)
            wall, path = figures["wall"], figures["path"]
            print(f"{label}: make up from empty ({run}), to verify-cluster: {wall:.1f} s")
            print(f"{label}:   critical path (steps along their dependencies, the first boot in them): {path:.1f} s")
            overhead = wall - path
            print(f"{label}:   engine overhead (wall minus critical path): {overhead:.1f} s ({overhead / wall:.0%})")
            for part, what in PARTS.items():
                print(f"{label}:     {figures[part]:5.1f} s {what}")
            steps, size = int(figures["steps"]), figures["state MB"]
            print(f"{label}:   state after it: {size:.1f} MB, written whole at the start and end of its {steps} steps")
            print(f"{label}:   CPU of make up's processes (the CLI, its plugins, the program): {figures['cpu']:.1f} s")
            if run == "template built":
                started = time.monotonic()
                again = lab.make("up", args="--yes", timeout=1800, cli_parallel=True)
                assert again.ok and again.summary() == {}, again.output[-3000:]
                print(f"{label}: make up with no change: {time.monotonic() - started:.1f} s")
                failover = balancer_failover(box)
                moved = failover["answered_after_s"]
                print(f"{label}: VIP holder powered off -> VIP answers from the other balancer: {moved} s")
            destroyed = lab.make("destroy", args="--yes", timeout=1800, cli_parallel=True)
            assert destroyed.ok, destroyed.output[-3000:]


LABS = {
    "default": ("default lab (7 VMs)", None),
    "ten": ("10 workers (15 VMs)", [(f"labs-k8s-w{i:02d}", f"10.3.60.{109 + i}") for i in range(1, 11)]),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", choices=sorted(LABS), action="append", help="only this lab (default: both)")
    chosen = parser.parse_args().lab or list(LABS)
    # Kept (its artifacts are the CLI's output of every run): a failed run is looked into there.
    work = tempfile.mkdtemp(prefix="labs-k8s-bench-")
    print(f"bench: the boxes' artifacts are kept under {work}", flush=True)
    for name in chosen:
        label, workers = LABS[name]
        measure(label, Path(work) / name, workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
