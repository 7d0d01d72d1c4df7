"""What every drill shares: bounds, the timeline, the verdict, and putting the lab back.

Safety rules, in code rather than in a runbook:
- a drill refuses to start unless the stack is fully up (`Drill.preflight`);
- every wait is bounded (`Limits`); the first broken bound fails the drill, which then stops;
- whatever the drill powered off, cordoned or created is undone in `finally`, also after a
  failure, Ctrl-C or SIGTERM; while that runs, further Ctrl-C/SIGTERM are announced and
  ignored, so an impatient second Ctrl-C cannot leave a control plane off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from components.tools.drills.cluster import Cluster, ClusterError, EtcdStatus
from components.tools.drills.inputs import DrillInputs, NodeInfo
from components.tools.drills.vcenter import VCenterMachines
from components.vsphere import VSphereError

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_REFUSED = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


@dataclass(frozen=True)
class Limits:
    """Every bound a drill enforces, in seconds. Defaults are for the live lab."""

    api_gap_s: float = 30  # longest time the API may fail through the VIP after a control plane/balancer dies
    etcd_degraded_s: float = 60  # after power-off: etcd reports the member lost, quorum and one leader kept
    notready_s: float = 120  # after power-off: node NotReady (node-monitor-grace-period is 40-50 s)
    vip_move_s: float = 60  # after power-off: the other balancer reports the VIP (Keepalived ~3 s + Tools' 30 s)
    back_ready_s: float = 300  # after power-on: the node is Ready again
    etcd_recover_s: float = 300  # after power-on: every etcd member healthy, one leader
    balancer_back_s: float = 300  # after power-on: the balancer's Tools report its address again
    single_holder_s: float = 60  # after the balancer is back: exactly one VIP holder, stable_samples in a row
    pods_ready_s: float = 180  # the test deployment rolled out (includes the image pull)
    reschedule_s: float = 120  # after NotReady (worker) or drain: every test pod Ready on another node
    drain_s: float = 120  # kubectl drain --timeout
    api_poll_s: float = 1.0
    poll_s: float = 2.0
    retry_pause_s: float = 2.0  # between attempts to power a VM back on
    stable_samples: int = 3

    def scaled(self, factor: float) -> Limits:
        """Every duration multiplied by ``factor`` (tests run the same drills in seconds)."""
        return dataclasses.replace(
            self,
            **{f.name: getattr(self, f.name) * factor for f in dataclasses.fields(self) if f.name.endswith("_s")},
        )


@dataclass(frozen=True)
class Event:
    t: float  # seconds since the drill started
    text: str

    def __str__(self) -> str:
        return f"t+{self.t:6.1f}s  {self.text}"


@dataclass(frozen=True)
class Measurement:
    key: str
    seconds: float
    text: str


@dataclass
class DrillResult:
    scenario: str
    stack: str
    verdict: str  # PASS, FAIL, REFUSED or INTERRUPTED
    events: list[Event] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # broken bounds, errors, refusal reasons
    restore_problems: list[str] = field(default_factory=list)  # what could not be undone: do it by hand

    @property
    def exit_code(self) -> int:
        return {"PASS": EXIT_PASS, "REFUSED": EXIT_REFUSED, "INTERRUPTED": EXIT_INTERRUPTED}.get(
            self.verdict, EXIT_FAIL
        )

    def measured(self, key: str) -> float:
        for m in self.measurements:
            if m.key == key:
                return m.seconds
        raise KeyError(key)

    def render(self) -> str:
        lines = [f"== {self.scenario} drill on stack {self.stack}: {self.verdict} =="]
        if self.measurements:
            lines.append("measured:")
            lines += [f"  - {m.text}" for m in self.measurements]
        if self.failures:
            lines.append("refused because:" if self.verdict == "REFUSED" else "failed because:")
            lines += [f"  - {f}" for f in self.failures]
        if self.restore_problems:
            lines.append("NOT RESTORED, do it by hand:")
            lines += [f"  - {p}" for p in self.restore_problems]
        return "\n".join(lines)


class DrillFailed(Exception):
    """A bound was broken; the drill stops here and restores the lab."""


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM acts like Ctrl-C while the drill runs, so `kill <pid>` also restores the lab."""
    if not _main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def interrupts_deferred(say: Callable[[str], None]) -> Iterator[list[int]]:
    """While restoring, Ctrl-C and SIGTERM are noted and announced, not obeyed."""
    caught: list[int] = []
    if not _main_thread():
        yield caught
        return

    def handler(signum: int, frame: Any) -> None:
        caught.append(signum)
        say("interrupt ignored: still putting the lab back (power, cordon, test deployment); please wait")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class ApiWatch:
    """Probes GET /readyz through the VIP while a failure is in progress and measures the gaps."""

    def __init__(self, drill: Drill) -> None:
        self.drill = drill
        self.active = False
        self.probes = 0
        self.failures = 0
        self.longest_gap = 0.0
        self.total_gap = 0.0
        self.down_since: float | None = None
        self.last_probe = float("-inf")

    def start(self) -> None:
        self.active = True
        self.probe()

    def probe(self) -> None:
        now = self.drill.clock()
        self.last_probe = now
        ok = self.drill.cluster.api_answers()
        now = self.drill.clock()
        self.probes += 1
        limit = self.drill.limits.api_gap_s
        if ok:
            if self.down_since is not None:
                gap = now - self.down_since
                self.longest_gap = max(self.longest_gap, gap)
                self.total_gap += gap
                self.down_since = None
                self.drill.event(f"API answers through the VIP again (after {gap:.1f}s)")
            return
        self.failures += 1
        if self.down_since is None:
            self.down_since = now
            self.drill.event("API does not answer through the VIP")
        elif now - self.down_since > limit:
            gap = now - self.down_since
            self.longest_gap = max(self.longest_gap, gap)
            raise DrillFailed(f"the API did not answer through the VIP for {gap:.2f}s, over the {limit:g}s allowed")

    def due(self) -> bool:
        return self.active and self.drill.clock() - self.last_probe >= self.drill.limits.api_poll_s

    def stop(self) -> None:
        if self.down_since is not None:
            gap = self.drill.clock() - self.down_since
            self.longest_gap = max(self.longest_gap, gap)
            self.total_gap += gap
            self.down_since = None
        self.active = False
        self.drill.measure(
            "api_unavailable_s",
            self.total_gap,
            f"API unavailable through the VIP for {self.total_gap:.1f}s in total, longest gap "
            f"{self.longest_gap:.1f}s ({self.failures} of {self.probes} probes failed; "
            f"limit {self.drill.limits.api_gap_s:g}s)",
        )


class Drill:
    """One scenario. Subclasses implement `execute` (and `scenario_problems`, `plan`)."""

    scenario: ClassVar[str] = ""
    summary: ClassVar[str] = ""

    def __init__(
        self,
        inputs: DrillInputs,
        cluster: Cluster,
        machines: VCenterMachines,
        limits: Limits | None = None,
        target: str | None = None,
        out: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.inputs = inputs
        self.cluster = cluster
        self.machines = machines
        self.limits = limits or Limits()
        self.target = target
        self.out = out
        self.clock = clock
        self.sleep = sleep
        self.started = clock()
        self.events: list[Event] = []
        self.measurements: list[Measurement] = []
        self.failures: list[str] = []
        self.restore_problems: list[str] = []
        self.powered_off: list[str] = []
        self.cordoned: list[str] = []
        self.deployment_created = False
        self.interrupted = False
        self.baseline_etcd: EtcdStatus | None = None
        self.api = ApiWatch(self)

    # ------------------------------------------------------------------ recording

    def say(self, text: str) -> None:
        self.out(text)

    def event(self, text: str) -> float:
        now = self.clock()
        event = Event(now - self.started, text)
        self.events.append(event)
        self.out(str(event))
        return now

    def measure(self, key: str, seconds: float, text: str) -> None:
        self.measurements.append(Measurement(key, seconds, text))
        self.event(f"measured: {text}")

    def expect(self, ok: bool, failure: str) -> None:
        """A check that fails the verdict without stopping the drill."""
        if not ok and failure not in self.failures:
            self.failures.append(failure)
            self.event(f"CHECK FAILED: {failure}")

    # ------------------------------------------------------------------ waiting

    def wait_for(self, what: str, check: Callable[[], bool], limit_s: float, since: float | None = None) -> float:
        """Poll ``check`` until True; return seconds since ``since`` (default: now).

        The deadline is ``since + limit_s``; missing it raises DrillFailed. A ClusterError from
        ``check`` counts as "not yet" (the API may be blinking); the last one is quoted on timeout.
        While the API watch is active it is probed between checks.
        """
        start = self.clock() if since is None else since
        deadline = start + limit_s
        last_error: Exception | None = None
        next_check = self.clock()
        while True:
            if self.api.due():
                self.api.probe()
            now = self.clock()
            if now >= next_check:
                try:
                    if check():
                        return self.clock() - start
                    last_error = None
                except ClusterError as exc:
                    last_error = exc
                next_check = now + self.limits.poll_s
            if self.clock() >= deadline:
                detail = f" (last error: {last_error})" if last_error else ""
                raise DrillFailed(f"{what}: not within {limit_s:g}s{detail}")
            pause = self.limits.api_poll_s if self.api.active else self.limits.poll_s
            self.sleep(max(0.0, min(pause, next_check - self.clock(), deadline - self.clock())))

    # ------------------------------------------------------------------ actions the drill undoes

    def power_off(self, name: str) -> float:
        self.powered_off.append(name)  # first: a task that dies half-way is still undone
        self.machines.power_off(name)
        return self.event(f"powered off {name} in vCenter (hard power-off, no guest shutdown)")

    def power_on(self, name: str) -> float:
        self.machines.power_on(name)
        if name in self.powered_off:
            self.powered_off.remove(name)
        return self.event(f"powered on {name} in vCenter")

    def create_deployment(self, replicas: int) -> float:
        self.deployment_created = True
        self.cluster.create_test_deployment(replicas)
        return self.event(f"created the test deployment ({replicas} nginx replicas, 30 s eviction toleration)")

    def delete_deployment(self) -> None:
        self.cluster.delete_test_deployment()
        self.deployment_created = False
        self.event("removed the test deployment")

    def cordon(self, name: str) -> float:
        self.cordoned.append(name)
        self.cluster.cordon(name)
        return self.event(f"cordoned {name}")

    def uncordon(self, name: str) -> float:
        self.cluster.uncordon(name)
        if name in self.cordoned:
            self.cordoned.remove(name)
        return self.event(f"uncordoned {name}")

    def restore(self) -> None:
        """Undo everything still outstanding; what cannot be undone is listed for a human."""
        for name in list(self.powered_off):
            error: Exception | None = None
            for attempt in range(3):
                try:
                    self.power_on(name)
                    error = None
                    break
                except Exception as exc:  # any failure: try again, then tell a human
                    error = exc
                    if attempt < 2:
                        self.sleep(self.limits.retry_pause_s)
            if error is not None:
                self.restore_problems.append(f"power on VM {name} in vCenter (3 attempts failed: {error})")
        for name in list(self.cordoned):
            try:
                self.uncordon(name)
            except Exception as exc:
                self.restore_problems.append(f"kubectl uncordon {name} ({exc})")
        if self.deployment_created:
            try:
                self.delete_deployment()
            except Exception as exc:
                self.restore_problems.append(f"kubectl -n default delete deployment labs-k8s-drill-nginx ({exc})")

    # ------------------------------------------------------------------ the gate

    def preflight(self) -> list[str]:
        """Why the stack is not fully up (empty: go). Never changes anything."""
        problems = self.machines.problems(n.name for n in self.inputs.nodes)
        if not self.cluster.api_answers():
            problems.append(f"the API does not answer through the VIP ({self.inputs.api_endpoint}/readyz)")
            return problems  # nothing else can be asked then
        for node in self.inputs.kubernetes_nodes:
            try:
                if not self.cluster.node_ready(node.name):
                    problems.append(f"node {node.name} is not Ready")
                elif node.role == "worker" and not self.cluster.node_schedulable(node.name):
                    problems.append(
                        f"worker {node.name} is cordoned (left over from an earlier drill?): "
                        f"kubectl uncordon {node.name}"
                    )
            except ClusterError as exc:
                problems.append(f"cannot read node {node.name}: {exc}")
        expected = len(self.inputs.of_role("control-plane"))
        try:
            status = self.cluster.etcd_status()
        except ClusterError as exc:
            problems.append(f"cannot read etcd's status: {exc}")
        else:
            self.baseline_etcd = status
            if status.members != expected or status.healthy != expected or status.leaders != 1:
                problems.append(
                    f"etcd is not healthy: {status.members} members, {status.healthy} healthy, "
                    f"{status.leaders} leader(s); expected {expected}, {expected} and 1"
                )
        problems += self.scenario_problems()
        return problems

    @classmethod
    def layout_problems(cls, nodes: Sequence[NodeInfo], target: str | None) -> list[str]:
        """What the lab's node list alone rules out: the live run refuses it, and so does --dry-run."""
        return []

    def scenario_problems(self) -> list[str]:
        return self.layout_problems(self.inputs.nodes, self.target)

    def execute(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ running

    def run(self) -> DrillResult:
        self.event(f"{self.scenario} drill on stack {self.inputs.stack}: checking that the stack is fully up")
        refused: list[str] = []
        try:
            with terminate_as_interrupt():
                refused = self.preflight()
                if refused:
                    for problem in refused:
                        self.event(f"not up: {problem}")
                else:
                    self.event("stack is fully up: every VM on, every node Ready, API and etcd healthy")
                    self.execute()
        except DrillFailed as exc:
            self.failures.append(str(exc))
            self.event(f"FAILED: {exc}; stopping and restoring")
        except KeyboardInterrupt:
            self.interrupted = True
            self.event("interrupted (Ctrl-C / SIGTERM): restoring the lab")
        except (ClusterError, VSphereError) as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")
            self.event(f"FAILED: {exc}; stopping and restoring")
        finally:
            with interrupts_deferred(self.say):
                self.restore()
        if self.api.active:
            self.api.stop()
        if refused:
            verdict = "REFUSED"
            self.failures = refused + self.failures
        elif self.interrupted:
            verdict = "INTERRUPTED"
        elif self.failures or self.restore_problems:
            verdict = "FAIL"
        else:
            verdict = "PASS"
        self.event(f"verdict: {verdict}")
        return DrillResult(
            scenario=self.scenario,
            stack=self.inputs.stack,
            verdict=verdict,
            events=list(self.events),
            measurements=list(self.measurements),
            failures=list(self.failures),
            restore_problems=list(self.restore_problems),
        )
