"""The four drills (seed 000 "Тестирование отказоустойчивости", seed 003 failure tests).

Each `execute` is the happy path; bounds come from `Limits`; `Drill.run` wraps it with the
fully-up gate, the verdict and the restore. `plan` is the offline description `--dry-run`
prints, step for step what `execute` does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from components.tools.drills.cluster import DRAIN_FLAGS, EVICTION_TOLERATION_S, TEST_DEPLOYMENT
from components.tools.drills.engine import Drill, DrillFailed, Limits
from components.tools.drills.inputs import NodeInfo


def _names(nodes: Sequence[NodeInfo]) -> str:
    return ", ".join(n.name for n in nodes)


class ControlPlaneDrill(Drill):
    """Hard power-off of one control plane: the API stays up through the VIP, etcd keeps quorum.

    The target is an etcd *follower* unless --node says otherwise. Why: the drill proves that
    losing any one of three members costs neither the API nor quorum; with a follower the
    measured API gap is HAProxy's failover alone, the same on every run. Killing the leader adds
    an etcd election (about a second of refused writes) on top; run it on purpose with
    `--node <leader>` (the drill prints who leads) to measure that case.
    """

    scenario = "control-plane"
    summary = "power off a control plane; API and etcd quorum survive; it rejoins"

    @classmethod
    def layout_problems(cls, nodes: Sequence[NodeInfo], target: str | None) -> list[str]:
        cps = [n for n in nodes if n.role == "control-plane"]
        problems = []
        if len(cps) < 3:
            problems.append(f"{len(cps)} control plane(s): etcd keeps quorum after losing one only with 3 or more")
        if target and target not in {n.name for n in cps}:
            problems.append(f"--node {target} is not a control plane ({_names(cps)})")
        return problems

    def _leader(self) -> str | None:
        ip = self.baseline_etcd.leader_ip if self.baseline_etcd else None
        return next((n.name for n in self.inputs.of_role("control-plane") if n.ip == ip), None)

    def execute(self) -> None:
        cps = [n.name for n in self.inputs.of_role("control-plane")]
        count = len(cps)
        leader = self._leader()
        target = self.target or next(n for n in sorted(cps) if n != leader)
        role = "the etcd leader" if target == leader else "an etcd follower"
        self.event(f"etcd leader is {leader or 'unknown'}; powering off {target} ({role})")
        off = self.power_off(target)
        self.api.start()

        def degraded() -> bool:
            status = self.cluster.etcd_status()
            self.expect(status.has_quorum, f"etcd lost quorum: {status.healthy} of {status.members} healthy")
            return status.members == count and status.healthy == count - 1 and status.leaders == 1

        seconds = self.wait_for(
            f"etcd reporting {count - 1} of {count} members healthy with one leader",
            degraded,
            self.limits.etcd_degraded_s,
            since=off,
        )
        self.measure(
            "etcd_degraded_s",
            seconds,
            f"etcd reported {count - 1}/{count} healthy with one leader "
            f"(quorum kept) {seconds:.1f}s after power-off (limit {self.limits.etcd_degraded_s:g}s)",
        )
        seconds = self.wait_for(
            f"{target} NotReady", lambda: not self.cluster.node_ready(target), self.limits.notready_s, since=off
        )
        self.measure(
            "node_notready_s",
            seconds,
            f"{target} NotReady {seconds:.1f}s after power-off (limit {self.limits.notready_s:g}s)",
        )
        self.wait_for("the API answering through the VIP", self.cluster.api_answers, self.limits.api_gap_s)

        on = self.power_on(target)
        seconds = self.wait_for(
            f"{target} Ready", lambda: self.cluster.node_ready(target), self.limits.back_ready_s, since=on
        )
        self.measure(
            "node_ready_s",
            seconds,
            f"{target} Ready {seconds:.1f}s after power-on (limit {self.limits.back_ready_s:g}s)",
        )

        def recovered() -> bool:
            status = self.cluster.etcd_status()
            return status.members == count and status.healthy == count and status.leaders == 1

        seconds = self.wait_for(
            f"etcd back to {count} healthy members", recovered, self.limits.etcd_recover_s, since=on
        )
        self.measure(
            "etcd_recovered_s",
            seconds,
            f"etcd {count}/{count} healthy {seconds:.1f}s after power-on (limit {self.limits.etcd_recover_s:g}s)",
        )
        self.api.stop()

    @classmethod
    def plan(cls, nodes: Sequence[NodeInfo], vip: str, target: str | None, limits: Limits) -> list[str]:
        cps = [n for n in nodes if n.role == "control-plane"]
        who = target or f"an etcd follower, chosen at run time from {_names(cps)} (the leader is skipped)"
        return [
            "refuse unless every VM is on and tagged with this stack, every node Ready, the API answers "
            f"through {vip}:6443 and etcd has {len(cps)} healthy members and one leader",
            f"hard power-off of {who} in vCenter",
            f"probe GET /readyz through the VIP every {limits.api_poll_s:g}s: no gap longer than {limits.api_gap_s:g}s",
            f"etcd must report {len(cps) - 1}/{len(cps)} healthy with one leader within "
            f"{limits.etcd_degraded_s:g}s (quorum kept)",
            f"the node must turn NotReady within {limits.notready_s:g}s",
            f"power it on; Ready within {limits.back_ready_s:g}s; etcd {len(cps)}/{len(cps)} healthy "
            f"within {limits.etcd_recover_s:g}s",
        ]


class BalancerDrill(Drill):
    """Hard power-off of the balancer holding the VIP: the VIP moves, the API keeps answering.

    Who holds the VIP is read from vCenter: VMware Tools report the VIP among the balancer's
    guest addresses (Keepalived adds it to ens192). Tools refresh those every 30 s by default,
    so "VIP moved in Y s" is an upper bound; the API probes through the VIP measure the
    client-visible gap directly.
    """

    scenario = "balancer"
    summary = "power off the balancer holding the VIP; the VIP moves; one holder afterwards"

    def _balancers(self) -> list[str]:
        return [n.name for n in self.inputs.of_role("balancer")]

    @classmethod
    def layout_problems(cls, nodes: Sequence[NodeInfo], target: str | None) -> list[str]:
        balancers = [n for n in nodes if n.role == "balancer"]
        return [f"{len(balancers)} balancer(s): the VIP has nowhere to move"] if len(balancers) < 2 else []

    def scenario_problems(self) -> list[str]:
        balancers = self._balancers()
        if problems := self.layout_problems(self.inputs.nodes, self.target):
            return problems
        holders = self.machines.vip_holders(balancers, self.inputs.vip)
        if len(holders) != 1:
            return [
                f"{len(holders)} balancers report the VIP {self.inputs.vip} ({', '.join(holders) or 'none'}); "
                "expected exactly one (VMware Tools running on both?)"
            ]
        return []

    def execute(self) -> None:
        balancers = self._balancers()
        vip = self.inputs.vip
        holder = self.machines.vip_holders(balancers, vip)[0]
        others = [b for b in balancers if b != holder]
        self.event(f"VIP {vip} is held by {holder}")
        off = self.power_off(holder)
        self.api.start()

        def moved() -> bool:
            holders = self.machines.vip_holders(balancers, vip)
            return len(holders) == 1 and holders[0] in others

        seconds = self.wait_for(
            f"VIP {vip} reported by another balancer ({', '.join(others)})", moved, self.limits.vip_move_s, since=off
        )
        new_holder = self.machines.vip_holders(balancers, vip)[0]
        self.measure(
            "vip_moved_s",
            seconds,
            f"VIP moved to {new_holder} {seconds:.1f}s after power-off, as "
            f"VMware Tools report it (limit {self.limits.vip_move_s:g}s)",
        )
        self.wait_for("the API answering through the VIP", self.cluster.api_answers, self.limits.api_gap_s)

        on = self.power_on(holder)
        own_ip = self.inputs.node(holder).ip
        seconds = self.wait_for(
            f"{holder} reporting its address {own_ip} again",
            lambda: own_ip in self.machines.guest_ips(holder),
            self.limits.balancer_back_s,
            since=on,
        )
        self.measure(
            "balancer_back_s",
            seconds,
            f"{holder} back (Tools report {own_ip}) {seconds:.1f}s after "
            f"power-on (limit {self.limits.balancer_back_s:g}s)",
        )
        streak: list[str] = []

        def single_holder() -> bool:
            holders = self.machines.vip_holders(balancers, vip)
            if len(holders) != 1:
                if len(holders) > 1:
                    self.event(f"both balancers report the VIP ({', '.join(holders)})")
                streak.clear()
                return False
            streak.append(holders[0])
            return len(streak) >= self.limits.stable_samples and len(set(streak[-self.limits.stable_samples :])) == 1

        back = self.clock()
        seconds = self.wait_for(
            f"exactly one VIP holder ({self.limits.stable_samples} samples in a row)",
            single_holder,
            self.limits.single_holder_s,
        )
        final = streak[-1]
        how = "preempted back" if final == holder else "stayed"
        self.measure(
            "single_holder_s",
            self.clock() - back,
            f"exactly one VIP holder, {final} (the VIP {how}), confirmed {seconds:.1f}s after {holder} "
            f"was back (limit {self.limits.single_holder_s:g}s)",
        )
        self.api.stop()

    @classmethod
    def plan(cls, nodes: Sequence[NodeInfo], vip: str, target: str | None, limits: Limits) -> list[str]:
        balancers = [n for n in nodes if n.role == "balancer"]
        return [
            f"refuse unless the stack is fully up and exactly one of {_names(balancers)} reports {vip} "
            "among its guest addresses (VMware Tools, ens192)",
            "hard power-off of that balancer in vCenter",
            f"probe GET /readyz through {vip}:6443 every {limits.api_poll_s:g}s: no gap longer than "
            f"{limits.api_gap_s:g}s",
            f"the other balancer must report {vip} within {limits.vip_move_s:g}s (Tools report every 30 s)",
            f"power it on; its Tools report its own address within {limits.balancer_back_s:g}s; then exactly one "
            f"VIP holder, {limits.stable_samples} samples in a row, within {limits.single_holder_s:g}s",
        ]


class _WorkloadDrill(Drill):
    """Shared by the worker and drain drills: the test deployment and the choice of worker."""

    def _workers(self) -> list[str]:
        return [n.name for n in self.inputs.of_role("worker")]

    @classmethod
    def layout_problems(cls, nodes: Sequence[NodeInfo], target: str | None) -> list[str]:
        workers = [n.name for n in nodes if n.role == "worker"]
        problems = []
        if len(workers) < 2:
            problems.append(f"{len(workers)} worker(s): the test pods have nowhere else to go")
        if target and target not in workers:
            problems.append(f"--node {target} is not a worker ({', '.join(workers)})")
        return problems

    def _replicas(self) -> int:
        return 2 * len(self._workers())

    def _all_elsewhere(self, target: str) -> bool:
        pods = self.cluster.pods_of_test_deployment()
        return len(pods) == self._replicas() and target not in pods

    def roll_out(self) -> str:
        """Create the test deployment, wait for it, and return the worker to drill."""
        replicas = self._replicas()
        created = self.create_deployment(replicas)
        seconds = self.wait_for(
            f"{replicas} test pods Ready",
            lambda: len(self.cluster.pods_of_test_deployment()) == replicas,
            self.limits.pods_ready_s,
            since=created,
        )
        placement = Counter(self.cluster.pods_of_test_deployment())
        self.measure(
            "deployment_ready_s",
            seconds,
            f"{replicas} test pods Ready in {seconds:.1f}s on "
            + ", ".join(f"{node} ({count})" for node, count in sorted(placement.items())),
        )
        if self.target:
            if not placement.get(self.target):
                raise DrillFailed(f"no test pod landed on {self.target}; nothing would move")
            return self.target
        return max(sorted(placement), key=lambda node: placement[node])


class WorkerDrill(_WorkloadDrill):
    """Hard power-off of a worker running test pods: NotReady, pods recreated on another worker.

    Kubernetes evicts pods from an unreachable node only after their toleration for
    node.kubernetes.io/unreachable runs out: 300 s by default (the seed's "5 minutes"). The test
    deployment tolerates it for 30 s, so this measures the mechanism in about a minute, not 6.
    """

    scenario = "worker"
    summary = "power off a worker running test pods; NotReady; pods recreated elsewhere; it rejoins"

    def execute(self) -> None:
        target = self.roll_out()
        off = self.power_off(target)
        seconds = self.wait_for(
            f"{target} NotReady", lambda: not self.cluster.node_ready(target), self.limits.notready_s, since=off
        )
        notready = self.clock()
        self.measure(
            "node_notready_s",
            seconds,
            f"{target} NotReady {seconds:.1f}s after power-off (limit {self.limits.notready_s:g}s)",
        )
        self.wait_for(
            f"every test pod Ready on a node other than {target}",
            lambda: self._all_elsewhere(target),
            self.limits.reschedule_s,
            since=notready,
        )
        seconds = self.clock() - off
        self.measure(
            "pods_rescheduled_s",
            seconds,
            f"test pods recreated elsewhere {seconds:.1f}s after power-off, "
            f"{self.clock() - notready:.1f}s after NotReady (limit {self.limits.reschedule_s:g}s after "
            f"NotReady; toleration {EVICTION_TOLERATION_S}s)",
        )
        on = self.power_on(target)
        seconds = self.wait_for(
            f"{target} Ready", lambda: self.cluster.node_ready(target), self.limits.back_ready_s, since=on
        )
        self.measure(
            "node_ready_s",
            seconds,
            f"{target} Ready {seconds:.1f}s after power-on (limit {self.limits.back_ready_s:g}s)",
        )
        self.delete_deployment()

    @classmethod
    def plan(cls, nodes: Sequence[NodeInfo], vip: str, target: str | None, limits: Limits) -> list[str]:
        workers = [n for n in nodes if n.role == "worker"]
        who = target or f"the worker of {_names(workers)} running most test pods"
        return [
            "refuse unless the stack is fully up (every VM on, nodes Ready, API, etcd) and no worker is cordoned",
            f"create deployment default/{TEST_DEPLOYMENT}: {2 * len(workers)} nginx pods spread over the workers, "
            f"tolerating node.kubernetes.io/unreachable and not-ready for {EVICTION_TOLERATION_S}s "
            f"(default 300 s); Ready within {limits.pods_ready_s:g}s",
            f"hard power-off of {who} in vCenter",
            f"NotReady within {limits.notready_s:g}s; every test pod Ready on another worker within "
            f"{limits.reschedule_s:g}s of NotReady",
            f"power it on; Ready within {limits.back_ready_s:g}s; delete the test deployment",
        ]


class DrainDrill(_WorkloadDrill):
    """Planned maintenance: cordon + drain a worker (seed flags), pods move, uncordon. No power-off."""

    scenario = "drain"
    summary = "cordon and drain a worker; pods move; uncordon"

    def execute(self) -> None:
        target = self.roll_out()
        self.cordon(target)
        self.expect(not self.cluster.node_schedulable(target), f"{target} is still schedulable after cordon")
        flags = f"{' '.join(DRAIN_FLAGS)} --timeout={self.limits.drain_s:g}s"
        start = self.event(f"draining {target}: kubectl drain {target} {flags}")
        try:
            self.cluster.drain(target, self.limits.drain_s)
        except Exception as exc:
            raise DrillFailed(f"kubectl drain {target} failed: {exc}") from exc
        self.measure(
            "drain_s",
            self.clock() - start,
            f"drain of {target} took {self.clock() - start:.1f}s (--timeout {self.limits.drain_s:g}s)",
        )
        seconds = self.wait_for(
            f"every test pod Ready on a node other than {target}",
            lambda: self._all_elsewhere(target),
            self.limits.reschedule_s,
            since=start,
        )
        self.measure(
            "pods_rescheduled_s",
            seconds,
            f"test pods Ready elsewhere {seconds:.1f}s after the drain started (limit {self.limits.reschedule_s:g}s)",
        )
        self.uncordon(target)
        self.expect(self.cluster.node_schedulable(target), f"{target} is still cordoned after uncordon")
        self.delete_deployment()

    @classmethod
    def plan(cls, nodes: Sequence[NodeInfo], vip: str, target: str | None, limits: Limits) -> list[str]:
        workers = [n for n in nodes if n.role == "worker"]
        who = target or f"the worker of {_names(workers)} running most test pods"
        return [
            "refuse unless the stack is fully up and no worker is cordoned",
            f"create deployment default/{TEST_DEPLOYMENT} ({2 * len(workers)} nginx pods); Ready within "
            f"{limits.pods_ready_s:g}s",
            f"kubectl cordon {who}",
            f"kubectl drain <node> {' '.join(DRAIN_FLAGS)} --timeout={limits.drain_s:g}s",
            f"every test pod Ready on another worker within {limits.reschedule_s:g}s of the drain's start",
            "kubectl uncordon <node> (also on failure or Ctrl-C); delete the test deployment",
        ]


SCENARIOS: dict[str, type[ControlPlaneDrill | BalancerDrill | WorkerDrill | DrainDrill]] = {
    cls.scenario: cls for cls in (ControlPlaneDrill, BalancerDrill, WorkerDrill, DrainDrill)
}


def plan_text(
    scenario: str, stack: str, nodes: Sequence[NodeInfo], vip: str, target: str | None, limits: Limits
) -> str:
    """What `drill <scenario> --dry-run` prints: nothing is contacted."""
    cls = SCENARIOS[scenario]
    steps = cls.plan(nodes, vip, target, limits)
    lines = [f"DRY RUN: {scenario} drill on stack {stack} ({cls.summary}); nothing is contacted or changed"]
    lines += [f"  {i}. {step}" for i, step in enumerate(steps, 1)]
    lines.append(
        "  always: power back on what was powered off, uncordon, delete the test deployment - also on "
        "failure, Ctrl-C or SIGTERM; exit 0 PASS, 1 FAIL, 2 refused, 130 interrupted"
    )
    lines.append("  nodes: " + ", ".join(f"{n.name} {n.ip} ({n.role})" for n in nodes))
    return "\n".join(lines)
