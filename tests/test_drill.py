"""The failure drills (components/tools/drills) against a real vCenter simulator and a cluster test double.

The vCenter side is real: every test gets its own vcsim (tests/vcsim.py) holding the lab's seven
VMs by their real names, tagged with the stack, and the drills power them off and on through
components.vsphere exactly as they would in vCenter.

The cluster side is `ClusterTestDouble`: no Kubernetes runs here. The double reads the VMs'
power state from vcsim (through components.vsphere) and reacts the way the lab would, on a
compressed clock: a powered-off node turns NotReady after a grace period, etcd loses that
member, the API blinks while HAProxy notices, pods on a dead worker are recreated elsewhere.

vcsim runs no guests, so no Keepalived moves the VIP: the double plays Keepalived and VMware
Tools. When the VIP holder has been off long enough it writes the VIP as the other balancer's
guest address in vcsim (vcsim's extraConfig SET.guest.ipAddress, what Tools would report), and
the drill sees the move through the same vCenter property it reads in the lab. vcsim also keeps a
powered-off VM's guest addresses (vCenter clears them); the drill ignores them for VMs not
powered on, and the double gives the returning balancer its own address back.

Bounds are the live ones scaled by SCALE, so a drill takes a few seconds.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyVmomi import vim

from components import vsphere as vs
from components.tools.cli import main as components_main
from components.tools.drills.cluster import (
    DRAIN_FLAGS,
    ClusterError,
    EtcdStatus,
    KubectlCluster,
    deployment_manifest,
    parse_etcd_status,
)
from components.tools.drills.engine import DrillResult, Limits
from components.tools.drills.inputs import DrillInputs, InputsError, load_inputs, parse_inputs
from components.tools.drills.scenarios import SCENARIOS
from components.tools.drills.vcenter import VCenterMachines
from tests.requirements import require_tool

if TYPE_CHECKING:
    from components.config import LabConfig
    from tests.vcsim import Vcsim

pytest_plugins = ["tests.vcsim"]

STACK = "labs"
VIP = "10.3.60.100"
LB1, LB2 = "labs-k8s-lb01", "labs-k8s-lb02"
M1, M2, M3 = "labs-k8s-m01", "labs-k8s-m02", "labs-k8s-m03"
W1, W2 = "labs-k8s-w01", "labs-k8s-w02"
ISO = "[LocalDS_0] iso/debian-12-preseeded.iso"
FAKE_KUBECONFIG = "apiVersion: v1\nkind: Config\n# test kubeconfig: SECRET-TOKEN-xyz\n"
SCALE = 0.02  # live bounds x 0.02: 30 s API gap -> 0.6 s, 300 s back to Ready -> 6 s
REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- the test double


class ClusterTestDouble:
    """Plays the lab's Kubernetes (and Keepalived) in reaction to vcsim's power states.

    Not a cluster: a handful of rules on a compressed clock. Knobs simulate failures:
    ``api_never_returns`` (the API stays down once a control plane is off),
    ``never_reschedule`` (pods of a dead worker are lost, not recreated),
    ``interrupt`` = (method, how) raises Ctrl-C in that method once a VM is off
    (how: "raise" KeyboardInterrupt, or a real "SIGINT"/"SIGTERM" sent to this process),
    ``interrupt_in_restore`` sends SIGINT while the drill deletes its deployment.
    """

    def __init__(
        self,
        machines: VCenterMachines,
        inputs: DrillInputs,
        *,
        api_gap_s: float = 0.1,
        notready_after_s: float = 0.3,
        ready_after_s: float = 0.2,
        evict_after_s: float = 0.3,
        vip_move_after_s: float = 0.2,
        etcd_leader: str = M1,
        not_ready: tuple[str, ...] = (),
        api_never_returns: bool = False,
        never_reschedule: bool = False,
        interrupt: tuple[str, str] | None = None,
        interrupt_in_restore: bool = False,
    ) -> None:
        self.machines = machines
        self.inputs = inputs
        self.api_gap_s = api_gap_s
        self.notready_after_s = notready_after_s
        self.ready_after_s = ready_after_s
        self.evict_after_s = evict_after_s
        self.vip_move_after_s = vip_move_after_s
        self.etcd_leader = etcd_leader
        self.not_ready = set(not_ready)
        self.api_never_returns = api_never_returns
        self.never_reschedule = never_reschedule
        self.interrupt = interrupt
        self.interrupt_in_restore = interrupt_in_restore
        self.calls: list[tuple[Any, ...]] = []
        self.observed_off: list[str] = []  # VMs this double saw powered off in vcsim, in order
        self.off_since: dict[str, float] = {}
        self.on_since: dict[str, float] = {}
        self.cordoned: set[str] = set()
        self.pods: list[str] | None = None  # node of each test pod; None = no deployment
        self.evicted_from: set[str] = set()
        self.created = 0
        self.deleted = 0
        holders = machines.vip_holders([LB1, LB2], VIP)
        self.vip_holder = holders[0] if holders else None
        self.vip_moves: list[tuple[str, str]] = []

    # ------------------------------------------------------------------ simulation

    def _sync(self, method: str) -> None:
        now = time.monotonic()
        for node in self.inputs.nodes:
            if self.machines.power_state(node.name) != "poweredOn":
                if node.name not in self.off_since:
                    self.off_since[node.name] = now
                    self.observed_off.append(node.name)
                self.on_since.pop(node.name, None)
            elif node.name in self.off_since:
                del self.off_since[node.name]
                self.on_since[node.name] = now
        self._keepalived(now)
        self._evict(now)
        if self.interrupt and self.interrupt[0] == method and self.off_since:
            how = self.interrupt[1]
            self.interrupt = None
            if how == "raise":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGINT if how == "SIGINT" else signal.SIGTERM)
            time.sleep(0.01)  # the handler runs at the next bytecode boundary

    def _set_guest_ip(self, name: str, ip: str) -> None:
        """What VMware Tools would report: vcsim's SET.guest.ipAddress extraConfig."""
        spec = vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key="SET.guest.ipAddress", value=ip)])
        vs.wait_for_task(self.machines.vm(name).ReconfigVM_Task(spec), f"guest IP of {name}")

    def _keepalived(self, now: float) -> None:
        holder = self.vip_holder
        if holder is None or now - self.off_since.get(holder, now) < self.vip_move_after_s:
            return
        backup = next((b for b in (LB1, LB2) if b != holder and b not in self.off_since), None)
        if backup is None:
            return
        self._set_guest_ip(holder, self.inputs.node(holder).ip)  # its own address once it boots
        self._set_guest_ip(backup, VIP)
        self.vip_holder = backup
        self.vip_moves.append((holder, backup))

    def _node_down(self, name: str, now: float) -> bool:
        if name in self.not_ready:
            return True
        if name in self.off_since:
            return now - self.off_since[name] >= self.notready_after_s
        return name in self.on_since and now - self.on_since[name] < self.ready_after_s

    def _evict(self, now: float) -> None:
        if self.pods is None:
            return
        for node in {p for p in self.pods}:
            off = self.off_since.get(node)
            if off is not None and now - off >= self.notready_after_s + self.evict_after_s:
                self._move_pods_off(node, now)

    def _move_pods_off(self, node: str, now: float) -> None:
        assert self.pods is not None
        targets = [w for w in (W1, W2) if w != node and w not in self.cordoned and not self._node_down(w, now)]
        moved = [] if self.never_reschedule else [targets[i % len(targets)] for i in range(self.pods.count(node))]
        self.pods = [p for p in self.pods if p != node] + moved
        self.evicted_from.add(node)

    def _cp_off_for(self, now: float) -> float | None:
        offs = [now - self.off_since[n] for n in (M1, M2, M3) if n in self.off_since]
        return max(offs) if offs else None

    # ------------------------------------------------------------------ Cluster

    def api_answers(self) -> bool:
        self._sync("api_answers")
        now = time.monotonic()
        self.calls.append(("api_answers",))
        cp_off = self._cp_off_for(now)
        if cp_off is not None and (self.api_never_returns or cp_off < self.api_gap_s):
            return False
        lb_off = self.off_since.get(self.vip_holder or "")
        return not (lb_off is not None and now - lb_off < self.vip_move_after_s)

    def node_ready(self, name: str) -> bool:
        self._sync("node_ready")
        self.calls.append(("node_ready", name))
        return not self._node_down(name, time.monotonic())

    def node_schedulable(self, name: str) -> bool:
        self._sync("node_schedulable")
        return name not in self.cordoned

    def etcd_status(self) -> EtcdStatus:
        self._sync("etcd_status")
        self.calls.append(("etcd_status",))
        up = [n for n in (M1, M2, M3) if n not in self.off_since]
        leader = self.etcd_leader if self.etcd_leader in up else (up[0] if len(up) >= 2 else None)
        return EtcdStatus(
            members=3,
            healthy=len(up),
            leaders=1 if leader else 0,
            leader_ip=self.inputs.node(leader).ip if leader else None,
        )

    def create_test_deployment(self, replicas: int) -> None:
        self._sync("create_test_deployment")
        self.calls.append(("create_test_deployment", replicas))
        self.created += 1
        self.pods = [(W1, W2)[i % 2] for i in range(replicas)]

    def delete_test_deployment(self) -> None:
        self.calls.append(("delete_test_deployment",))
        if self.interrupt_in_restore:
            self.interrupt_in_restore = False
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
        self.pods = None
        self.deleted += 1

    def pods_of_test_deployment(self) -> list[str]:
        self._sync("pods_of_test_deployment")
        return sorted(self.pods or [])

    def cordon(self, name: str) -> None:
        self.calls.append(("cordon", name))
        self.cordoned.add(name)

    def drain(self, name: str, timeout_s: float) -> None:
        self._sync("drain")
        self.calls.append(("drain", name, timeout_s))
        self.cordoned.add(name)
        if self.pods is not None:
            self._move_pods_off(name, time.monotonic())

    def uncordon(self, name: str) -> None:
        self.calls.append(("uncordon", name))
        self.cordoned.discard(name)


# --------------------------------------------------------------------------- fixtures


@dataclass
class SimLab:
    si: Any
    machines: VCenterMachines
    inputs: DrillInputs
    out: list[str]

    def double(self, **knobs: Any) -> ClusterTestDouble:
        return ClusterTestDouble(self.machines, self.inputs, **knobs)

    def run(self, scenario: str, double: ClusterTestDouble, target: str | None = None) -> DrillResult:
        drill = SCENARIOS[scenario](
            self.inputs, double, self.machines, limits=Limits().scaled(SCALE), target=target, out=self.out.append
        )
        return drill.run()

    def states(self) -> dict[str, str]:
        return {n.name: self.machines.power_state(n.name) for n in self.inputs.nodes}

    def all_on(self) -> bool:
        return set(self.states().values()) == {"poweredOn"}


def lab_inputs(lab_config: LabConfig) -> DrillInputs:
    outputs = {
        "apiEndpoint": f"https://{VIP}:6443",
        "kubeconfig": FAKE_KUBECONFIG,
        "nodes": [{"name": n.name, "role": n.role.value, "ip": str(n.ip)} for n in lab_config.all_nodes],
    }
    return parse_inputs(STACK, outputs, need_vcenter=False)


@pytest.fixture
def sim(vcsim: Vcsim, lab_config: LabConfig) -> Iterator[SimLab]:
    """The lab's seven VMs in vcsim, powered on, tagged with the stack; lb01 reports the VIP."""
    inputs = lab_inputs(lab_config)
    with vs.session(vcsim.host, vcsim.user, vcsim.password, port=vcsim.port, insecure=True) as si:
        for node in inputs.nodes:
            spec = vs.BuilderVmSpec(
                name=node.name,
                datacenter=vcsim.datacenter,
                cluster=vcsim.cluster,
                datastore=vcsim.datastore,
                network=vcsim.network,
                iso_path=ISO,
                num_cpus=1,
                memory_mib=256,
                disk_gib=1,
                extra_config={**vs.stack_tag(STACK), "SET.guest.ipAddress": VIP if node.name == LB1 else node.ip},
            )
            vs.power_on(vs.create_builder_vm(si, spec).vm)
        yield SimLab(si, VCenterMachines(si, STACK, vcsim.datacenter), inputs, [])


def texts(result: DrillResult) -> list[str]:
    return [e.text for e in result.events]


def index_of(result: DrillResult, prefix: str) -> int:
    matches = [i for i, text in enumerate(texts(result)) if text.startswith(prefix)]
    assert matches, f"no event starting {prefix!r} in:\n" + "\n".join(texts(result))
    return matches[0]


def assert_in_order(result: DrillResult, *prefixes: str) -> None:
    positions = [index_of(result, p) for p in prefixes]
    assert positions == sorted(positions), "\n".join(texts(result))


# --------------------------------------------------------------------------- the vCenter side alone


def test_vcenter_side_reads_vcsim(sim: SimLab) -> None:
    assert sim.all_on()
    assert sim.machines.vip_holders([LB1, LB2], VIP) == [LB1]
    assert vs.vm_guest_ips(sim.machines.vm(W1)) == {"10.3.60.54"}
    assert vs.vm_stack(sim.machines.vm(W1)) == STACK
    assert sim.machines.problems(n.name for n in sim.inputs.nodes) == []
    assert VCenterMachines(sim.si, "other").problems([W1]) == [
        f"VM '{W1}' belongs to stack 'labs', not to stack 'other': a drill never touches it"
    ]
    sim.machines.power_off(LB1)
    assert sim.machines.vip_holders([LB1, LB2], VIP) == []  # vcsim keeps the address; the drill must not
    assert sim.machines.problems([LB1]) == [f"VM '{LB1}' is poweredOff in vCenter"]


# --------------------------------------------------------------------------- the four drills


def test_control_plane_drill_passes(sim: SimLab) -> None:
    double = sim.double(etcd_leader=M1)
    result = sim.run("control-plane", double)

    assert result.verdict == "PASS", result.render()
    assert result.exit_code == 0
    # The leader (m01) is spared; the first follower by name is powered off for real in vcsim.
    assert double.observed_off == [M2]
    assert sim.all_on()
    assert_in_order(
        result,
        "etcd leader is labs-k8s-m01; powering off labs-k8s-m02 (an etcd follower)",
        "powered off labs-k8s-m02 in vCenter",
        "measured: etcd reported 2/3 healthy with one leader (quorum kept)",
        "measured: labs-k8s-m02 NotReady",
        "powered on labs-k8s-m02 in vCenter",
        "measured: labs-k8s-m02 Ready",
        "measured: etcd 3/3 healthy",
        "measured: API unavailable through the VIP",
        "verdict: PASS",
    )
    # The double's API blinks for 0.1 s after the power-off: measured, and within the (scaled) bound.
    assert 0 < result.measured("api_unavailable_s") < Limits().scaled(SCALE).api_gap_s
    assert result.measured("node_notready_s") >= 0.3
    assert "API does not answer through the VIP" in texts(result)
    assert all(line.startswith("t+") for line in sim.out)  # the live timeline


def test_control_plane_drill_can_target_the_leader(sim: SimLab) -> None:
    double = sim.double(etcd_leader=M1)
    result = sim.run("control-plane", double, target=M1)
    assert result.verdict == "PASS", result.render()
    assert double.observed_off == [M1]
    assert "etcd leader is labs-k8s-m01; powering off labs-k8s-m01 (the etcd leader)" in texts(result)
    assert sim.all_on()


def test_balancer_drill_moves_the_vip(sim: SimLab) -> None:
    double = sim.double()
    result = sim.run("balancer", double)

    assert result.verdict == "PASS", result.render()
    assert double.observed_off == [LB1]
    assert double.vip_moves == [(LB1, LB2)]
    assert sim.all_on()
    # What vCenter reports at the end: lb02 holds the VIP, lb01 is back with its own address.
    assert sim.machines.vip_holders([LB1, LB2], VIP) == [LB2]
    assert "10.3.60.50" in sim.machines.guest_ips(LB1)
    assert_in_order(
        result,
        "VIP 10.3.60.100 is held by labs-k8s-lb01",
        "powered off labs-k8s-lb01 in vCenter",
        "measured: VIP moved to labs-k8s-lb02",
        "powered on labs-k8s-lb01 in vCenter",
        "measured: labs-k8s-lb01 back",
        "measured: exactly one VIP holder, labs-k8s-lb02 (the VIP stayed)",
        "verdict: PASS",
    )
    assert result.measured("vip_moved_s") >= 0.2


def test_worker_drill_reschedules_pods(sim: SimLab) -> None:
    double = sim.double()
    result = sim.run("worker", double)

    assert result.verdict == "PASS", result.render()
    assert double.observed_off == [W1]  # 2 pods on each worker: the first by name
    assert double.evicted_from == {W1}
    assert sim.all_on()
    assert double.created == 1 and double.deleted == 1 and double.pods is None
    assert ("create_test_deployment", 4) in double.calls
    assert_in_order(
        result,
        "created the test deployment (4 nginx replicas",
        "measured: 4 test pods Ready",
        "powered off labs-k8s-w01 in vCenter",
        "measured: labs-k8s-w01 NotReady",
        "measured: test pods recreated elsewhere",
        "powered on labs-k8s-w01 in vCenter",
        "measured: labs-k8s-w01 Ready",
        "removed the test deployment",
        "verdict: PASS",
    )
    assert result.measured("pods_rescheduled_s") > result.measured("node_notready_s")


def test_drain_drill_cordons_drains_uncordons(sim: SimLab) -> None:
    double = sim.double()
    result = sim.run("drain", double, target=W2)

    assert result.verdict == "PASS", result.render()
    assert double.observed_off == []  # maintenance, not a failure: nothing is powered off
    assert [c for c in double.calls if c[0] in ("cordon", "drain", "uncordon")] == [
        ("cordon", W2),
        ("drain", W2, Limits().scaled(SCALE).drain_s),
        ("uncordon", W2),
    ]
    assert double.cordoned == set() and double.pods is None
    drain_event = texts(result)[index_of(result, "draining labs-k8s-w02")]
    assert "--ignore-daemonsets --delete-emptydir-data --timeout=" in drain_event
    assert_in_order(
        result,
        "cordoned labs-k8s-w02",
        "draining",
        "measured: test pods Ready elsewhere",
        "uncordoned labs-k8s-w02",
        "removed the test deployment",
        "verdict: PASS",
    )


# --------------------------------------------------------------------------- failures and interrupts


def test_api_that_never_comes_back_fails_and_restores(sim: SimLab) -> None:
    double = sim.double(api_never_returns=True)
    result = sim.run("control-plane", double)

    assert result.verdict == "FAIL" and result.exit_code == 1
    assert double.observed_off == [M2]
    assert sim.all_on()  # powered back on although the drill failed
    assert any("the API did not answer through the VIP for" in f for f in result.failures), result.failures
    assert_in_order(
        result, "powered off labs-k8s-m02", "FAILED: the API did not answer", "powered on labs-k8s-m02", "verdict: FAIL"
    )
    assert "failed because:" in result.render()


def test_pods_never_rescheduled_fails_and_cleans_up(sim: SimLab) -> None:
    double = sim.double(never_reschedule=True)
    result = sim.run("worker", double)

    assert result.verdict == "FAIL" and result.exit_code == 1
    assert any("every test pod Ready on a node other than labs-k8s-w01: not within" in f for f in result.failures)
    assert sim.all_on()
    assert double.pods is None and double.deleted == 1  # the deployment is removed anyway


@pytest.fixture
def ctrl_c_reaches_the_process() -> Iterator[None]:
    """SIGINT as a drill started from a terminal has it: Python's default_int_handler.

    A process started in the background by a shell without job control (`cmd &` in a
    script, nohup) inherits SIGINT ignored, and Python then leaves it ignored (POSIX:
    ignored signals stay ignored across exec), so these tests would see no Ctrl-C at all.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_reaches_the_process")
@pytest.mark.parametrize("how", ["raise", "SIGINT", "SIGTERM"])
def test_ctrl_c_mid_drill_restores_power_and_deployment(sim: SimLab, how: str) -> None:
    sigterm_before = signal.getsignal(signal.SIGTERM)
    double = sim.double(interrupt=("node_ready", how))  # while waiting for the dead worker's NotReady
    result = sim.run("worker", double)

    assert result.verdict == "INTERRUPTED" and result.exit_code == 130
    assert double.observed_off == [W1]
    assert sim.all_on()
    assert double.pods is None and double.deleted == 1
    assert_in_order(
        result,
        "powered off labs-k8s-w01",
        "interrupted (Ctrl-C / SIGTERM)",
        "powered on labs-k8s-w01",
        "removed the test deployment",
        "verdict: INTERRUPTED",
    )
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers put back
    assert signal.getsignal(signal.SIGTERM) is sigterm_before


@pytest.mark.usefixtures("ctrl_c_reaches_the_process")
def test_second_ctrl_c_during_restore_is_ignored(sim: SimLab) -> None:
    double = sim.double(interrupt=("node_ready", "raise"), interrupt_in_restore=True)
    result = sim.run("worker", double)

    assert result.verdict == "INTERRUPTED"
    assert any("interrupt ignored: still putting the lab back" in line for line in sim.out)
    assert sim.all_on() and double.pods is None


def test_drain_interrupted_uncordons(sim: SimLab) -> None:
    double = sim.double(interrupt=("drain", "raise"))
    double.off_since["sentinel"] = 0.0  # the interrupt knob waits for "a VM off"; drain powers nothing off
    result = sim.run("drain", double, target=W1)
    assert result.verdict == "INTERRUPTED"
    assert ("uncordon", W1) in double.calls and double.cordoned == set()
    assert double.pods is None


# --------------------------------------------------------------------------- refusal


def test_refuses_when_a_node_is_not_ready(sim: SimLab) -> None:
    double = sim.double(not_ready=(W2,))
    result = sim.run("worker", double)

    assert result.verdict == "REFUSED" and result.exit_code == 2
    assert "node labs-k8s-w02 is not Ready" in result.failures
    assert double.observed_off == [] and double.created == 0
    assert sim.all_on()
    assert "refused because:" in result.render()


def test_refuses_when_a_vm_is_off(sim: SimLab) -> None:
    vs.power_off(sim.machines.vm(M3))
    double = sim.double()
    double.api_answers()  # the double notices m03 is off; its API blinks for api_gap_s
    time.sleep(0.2)
    result = sim.run("control-plane", double)
    assert result.verdict == "REFUSED"
    assert "VM 'labs-k8s-m03' is poweredOff in vCenter" in result.failures
    # The double sees m03 off: etcd has 2 healthy members, which the gate also reports.
    assert any(f.startswith("etcd is not healthy: 3 members, 2 healthy") for f in result.failures)
    assert double.observed_off == [M3]  # only the one that was already off
    assert vs.power_state(sim.machines.vm(M2)) == "poweredOn"


def test_refuses_vms_of_another_stack(sim: SimLab) -> None:
    other = VCenterMachines(sim.si, "someone-elses")
    double = sim.double()
    result = SCENARIOS["worker"](sim.inputs, double, other, limits=Limits().scaled(SCALE), out=sim.out.append).run()
    assert result.verdict == "REFUSED"
    assert f"VM '{W1}' belongs to stack 'labs', not to stack 'someone-elses': a drill never touches it" in (
        result.failures
    )
    assert double.observed_off == [] and double.created == 0


def test_balancer_refuses_without_a_single_vip_holder(sim: SimLab) -> None:
    ClusterTestDouble._set_guest_ip(sim.double(), LB2, VIP)  # both report the VIP: split brain
    result = sim.run("balancer", sim.double())
    assert result.verdict == "REFUSED"
    assert any(
        f.startswith("2 balancers report the VIP 10.3.60.100 (labs-k8s-lb01, labs-k8s-lb02)") for f in result.failures
    )
    assert sim.all_on()


def test_refuses_a_target_of_the_wrong_role(sim: SimLab) -> None:
    result = sim.run("control-plane", sim.double(), target=W1)
    assert result.verdict == "REFUSED"
    assert any("--node labs-k8s-w01 is not a control plane" in f for f in result.failures)


# --------------------------------------------------------------------------- inputs


@pytest.mark.parametrize(
    ("server", "host", "port"),
    [
        ("vcenter.labs.local", "vcenter.labs.local", 443),
        ("vcenter.labs.local:8443", "vcenter.labs.local", 8443),
        ("[fd00::10]:8443", "fd00::10", 8443),
    ],
)
def test_drill_login_reads_host_and_port_with_the_shared_parser(server: str, host: str, port: int) -> None:
    config = {"vsphere:vsphereServer": server, "vsphere:user": "u", "vsphere:password": "p"}
    node = {"name": "labs-k8s-m01", "role": "control-plane", "ip": "10.3.60.51"}
    outputs = {"apiEndpoint": f"https://{VIP}:6443", "kubeconfig": FAKE_KUBECONFIG, "nodes": [node]}
    inputs = parse_inputs(STACK, outputs, config=config, env={})
    assert inputs.vcenter is not None and (inputs.vcenter.server, inputs.vcenter.port) == (host, port)
    with pytest.raises(InputsError, match="is a URL"):
        parse_inputs(STACK, outputs, config={**config, "vsphere:vsphereServer": "https://vc/sdk"}, env={})


def test_parse_inputs_lists_every_problem() -> None:
    with pytest.raises(InputsError) as caught:
        parse_inputs(STACK, {"nodes": [{"name": "x", "role": "etcd", "ip": "1.2.3.4"}]}, config={}, env={})
    text = str(caught.value)
    assert "has no output apiEndpoint, kubeconfig: is it up? (`pulumi up --stack labs`)" in text
    assert "node 'x' has unknown role 'etcd'" in text
    assert "vCenter login incomplete, not set: vsphere:vsphereServer (or VSPHERE_SERVER)" in text


def test_load_inputs_reads_pulumi_and_keeps_secrets_out_of_reprs(lab_config: LabConfig) -> None:
    outputs = {
        "apiEndpoint": f"https://{VIP}:6443",
        "kubeconfig": FAKE_KUBECONFIG,
        "nodes": [{"name": n.name, "role": n.role.value, "ip": str(n.ip)} for n in lab_config.all_nodes],
        "templateUuid": "4200abc",
    }
    config = {
        "vsphere:vsphereServer": "vcenter.labs.local",
        "vsphere:user": "administrator@vsphere.local",
        "vsphere:allowUnverifiedSsl": "false",
        "labs-k8s:vsphere": json.dumps({"datacenter": "Datacenter"}),
    }
    calls: list[list[str]] = []

    def fake_pulumi(args: Any) -> subprocess.CompletedProcess[str]:
        args = list(args)
        calls.append(args)
        if args[:3] == ["pulumi", "stack", "output"]:
            return subprocess.CompletedProcess(args, 0, json.dumps(outputs), "")
        value = config.get(args[3])
        return subprocess.CompletedProcess(args, 0 if value else 1, (value or "") + "\n", "" if value else "no key")

    inputs = load_inputs(STACK, run=fake_pulumi, env={"VSPHERE_PASSWORD": "vc-SECRET-pw"})
    assert calls[0] == ["pulumi", "stack", "output", "--json", "--show-secrets", "--stack", "labs"]
    assert inputs.vcenter is not None
    assert inputs.vcenter.password == "vc-SECRET-pw"  # vsphere:password unset: VSPHERE_PASSWORD
    assert inputs.vcenter.server == "vcenter.labs.local" and inputs.vcenter.insecure is False
    assert inputs.datacenter == "Datacenter" and inputs.vip == VIP
    assert [n.name for n in inputs.of_role("worker")] == [W1, W2]
    shown = repr(inputs)
    assert "SECRET" not in shown and "vc-SECRET-pw" not in shown


# --------------------------------------------------------------------------- dry run and CLI


def test_dry_run_is_offline(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no pulumi, no kubectl, no vcsim
    for name in ("VSPHERE_SERVER", "VSPHERE_USER", "VSPHERE_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    assert components_main(["drill", "control-plane", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("DRY RUN: control-plane drill on stack labs")
    assert "hard power-off of an etcd follower, chosen at run time from labs-k8s-m01, labs-k8s-m02, labs-k8s-m03" in out
    assert "no gap longer than 30s" in out and "Ready within 300s" in out

    assert components_main(["drill", "worker", "--dry-run", "--node", W2]) == 0
    out = capsys.readouterr().out
    assert "hard power-off of labs-k8s-w02 in vCenter" in out
    assert "tolerating node.kubernetes.io/unreachable and not-ready for 30s (default 300 s)" in out

    assert components_main(["drill", "drain", "--dry-run"]) == 0
    assert "kubectl drain <node> --ignore-daemonsets --delete-emptydir-data --timeout=120s" in capsys.readouterr().out
    assert components_main(["drill", "balancer", "--dry-run"]) == 0
    assert "exactly one of labs-k8s-lb01, labs-k8s-lb02 reports 10.3.60.100" in capsys.readouterr().out
    assert components_main(["drill", "worker", "--dry-run", "--node", "nope"]) == 2


def test_cli_as_a_module_and_without_pulumi(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # an empty PATH: no pulumi CLI
    dry = subprocess.run(
        [sys.executable, "-m", "components", "drill", "balancer", "--dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dry.returncode == 0, dry.stderr
    live = subprocess.run(
        [sys.executable, "-m", "components", "drill", "worker", "--stack", "labs"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert live.returncode == 2
    assert "the Pulumi CLI is not on PATH" in live.stderr and "Traceback" not in live.stderr


# --------------------------------------------------------------------------- KubectlCluster


FAKE_KUBECTL = textwrap.dedent(
    '''\
    #!{python}
    """A recording stand-in for kubectl: canned answers for what KubectlCluster asks."""
    import json, os, stat, sys
    args = sys.argv[1:]
    kubeconfig = next(a.split("=", 1)[1] for a in args if a.startswith("--kubeconfig="))
    record = {{"args": args, "mode": oct(stat.S_IMODE(os.stat(kubeconfig).st_mode)),
              "content": open(kubeconfig).read()}}
    if "-" in args:
        record["stdin"] = sys.stdin.read()
    with open({log!r}, "a") as log:
        log.write(json.dumps(record) + "\\n")
    rest = [a for a in args if not a.startswith("--kubeconfig") and not a.startswith("--server")
            and not a.startswith("--request-timeout")]
    def node(name, ready="True"):
        return {{"metadata": {{"name": name}}, "spec": {{}},
                "status": {{"conditions": [{{"type": "Ready", "status": ready}}]}}}}
    if rest[:2] == ["get", "--raw"]:
        path = rest[2]
        if path == "/readyz":
            print("ok", end="")
        elif path.startswith("/api/v1/nodes/"):
            name = path.rsplit("/", 1)[1]
            print(json.dumps(node(name, "False" if name == "labs-k8s-m01" else "True")))
        elif "component%3Detcd" in path:
            print(json.dumps({{"items": [
                {{"metadata": {{"name": "etcd-labs-k8s-m01"}}, "spec": {{"nodeName": "labs-k8s-m01"}},
                 "status": {{"phase": "Running"}}}},
                {{"metadata": {{"name": "etcd-labs-k8s-m02"}}, "spec": {{"nodeName": "labs-k8s-m02"}},
                 "status": {{"phase": "Running"}}}}]}}))
        elif "/pods?" in path:
            print(json.dumps({{"items": []}}))
        sys.exit(0)
    if "exec" in rest:
        assert rest[rest.index("exec") + 1] == "etcd-labs-k8s-m02", rest  # m01 is NotReady: skipped
        tail = rest[rest.index("--") + 1:]
        if "member" in tail:
            print(json.dumps({{"members": [{{"ID": 1}}, {{"ID": 2}}, {{"ID": 3}}]}}))
        elif "health" in tail:
            print(json.dumps([{{"endpoint": "https://10.3.60.52:2379", "health": True}},
                              {{"endpoint": "https://10.3.60.53:2379", "health": True}},
                              {{"endpoint": "https://10.3.60.51:2379", "health": False}}]))
            sys.exit(1)
        else:
            print(json.dumps([
                {{"Endpoint": "https://10.3.60.52:2379",
                 "Status": {{"header": {{"member_id": 12205674928451734870}}, "leader": 12205674928451734870}}}},
                {{"Endpoint": "https://10.3.60.53:2379",
                 "Status": {{"header": {{"member_id": 77}}, "leader": 12205674928451734870}}}}]))
            print("Failed to get the status of endpoint https://10.3.60.51:2379", file=sys.stderr)
            sys.exit(1)
        sys.exit(0)
    if rest[:1] == ["drain"]:
        print("error: timed out waiting", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)
    '''
)


def test_kubectl_cluster_commands_and_kubeconfig_file(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable, log=str(log)))
    kubectl.chmod(0o755)

    with KubectlCluster(FAKE_KUBECONFIG, f"https://{VIP}:6443", kubectl=str(kubectl)) as cluster:
        path = Path(cluster.kubeconfig_path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert cluster.api_answers() is True
        assert cluster.node_ready("labs-k8s-m02") is True
        assert cluster.node_ready("labs-k8s-m01") is False
        status = cluster.etcd_status()
        assert status == EtcdStatus(members=3, healthy=2, leaders=1, leader_ip="10.3.60.52")
        assert status.has_quorum
        cluster.create_test_deployment(4)
        assert cluster.pods_of_test_deployment() == []
        cluster.cordon(W1)
        with pytest.raises(Exception, match="kubectl drain labs-k8s-w01 --ignore-daemonsets failed"):
            cluster.drain(W1, 90)
        cluster.uncordon(W1)
        cluster.delete_test_deployment()
    assert not path.exists()  # the kubeconfig is removed on exit

    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert {c["mode"] for c in calls} == {"0o600"}
    assert {c["content"] for c in calls} == {FAKE_KUBECONFIG}
    for call in calls:  # every call goes through the VIP and is bounded
        assert f"--server=https://{VIP}:6443" in call["args"]
        assert any(a.startswith("--request-timeout=") for a in call["args"])
    by_verb = {c["args"][3]: c["args"][3:] for c in calls if c["args"][3] in ("cordon", "drain", "uncordon", "apply")}
    assert by_verb["drain"] == ["drain", W1, *DRAIN_FLAGS, "--timeout=90s"]
    assert by_verb["cordon"] == ["cordon", W1] and by_verb["uncordon"] == ["uncordon", W1]
    applied = json.loads(next(c["stdin"] for c in calls if "apply" in c["args"]))
    assert applied == deployment_manifest(4)
    execs = [c["args"] for c in calls if "exec" in c["args"]]
    assert execs and all("--cacert=/etc/kubernetes/pki/etcd/ca.crt" in a for a in execs)
    assert any(a[-4:] == ["status", "--cluster", "-w", "json"] for a in execs)


BROKEN_HEALTH_KUBECTL = textwrap.dedent(
    """\
    #!{python}
    # kubectl whose exec into each pod in `broken` breaks after `member list`, as when the API
    # server's stream to the pod's kubelet fails or etcdctl dies before it checks an endpoint.
    import json, sys
    args = sys.argv[1:]
    if "--raw" in args:
        path = args[args.index("--raw") + 1]
        if "component%3Detcd" in path:
            print(json.dumps({{"items": [
                {{"metadata": {{"name": f"etcd-labs-k8s-{{n}}"}}, "spec": {{"nodeName": f"labs-k8s-{{n}}"}},
                 "status": {{"phase": "Running"}}}} for n in ("m01", "m03")]}}))
        else:
            print(json.dumps({{"status": {{"conditions": [{{"type": "Ready", "status": "True"}}]}}}}))
        sys.exit(0)
    pod, tail = args[args.index("exec") + 1], args[args.index("--") + 1:]
    if "member" in tail:
        print(json.dumps({{"members": [{{"ID": 1}}, {{"ID": 2}}, {{"ID": 3}}]}}))
    elif pod in {broken!r}:
        print("Error from server: error dialing backend: dial tcp 10.3.60.51:10250: i/o timeout", file=sys.stderr)
        sys.exit(1)
    elif "health" in tail:
        print(json.dumps([{{"endpoint": f"https://10.3.60.5{{i}}:2379", "health": i != 2}} for i in (1, 2, 3)]))
        print("Error: unhealthy cluster", file=sys.stderr)
        sys.exit(1)
    else:
        print(json.dumps([{{"Endpoint": "https://10.3.60.53:2379",
                           "Status": {{"header": {{"member_id": 3}}, "leader": 3}}}}]))
    """
)


@pytest.mark.parametrize("broken", [["etcd-labs-k8s-m01"], ["etcd-labs-k8s-m01", "etcd-labs-k8s-m03"]])
def test_an_etcd_health_check_that_printed_no_report_is_not_read_as_quorum_lost(
    tmp_path: Path, broken: list[str]
) -> None:
    """CI, 2026-12-06: the control-plane drill failed with "etcd lost quorum: 0 of 3 healthy" while
    2 of 3 members were up: `endpoint health` through one pod printed nothing (most likely the pod of
    the member just powered off, its node still Ready for the grace period: `member list` answered,
    then its kubelet stopped answering the exec, 10 s of dial), which counted as no member healthy.
    No report is "cannot tell": the next etcd pod is asked, and when none reports, ClusterError
    (the drill's wait polls again) instead of a verdict."""
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(BROKEN_HEALTH_KUBECTL.format(python=sys.executable, broken=broken))
    kubectl.chmod(0o755)
    with KubectlCluster(FAKE_KUBECONFIG, f"https://{VIP}:6443", kubectl=str(kubectl)) as cluster:
        if len(broken) == 1:
            status = cluster.etcd_status()
            assert status == EtcdStatus(members=3, healthy=2, leaders=1, leader_ip="10.3.60.53")
            assert status.has_quorum
        else:
            with pytest.raises(ClusterError, match=r"endpoint health printed no report: .*error dialing backend"):
                cluster.etcd_status()


def test_deployment_manifest_tolerates_unreachable_for_30s() -> None:
    manifest = deployment_manifest(4)
    pod = manifest["spec"]["template"]["spec"]
    assert {(t["key"], t["tolerationSeconds"]) for t in pod["tolerations"]} == {
        ("node.kubernetes.io/unreachable", 30),
        ("node.kubernetes.io/not-ready", 30),
    }
    assert manifest["spec"]["replicas"] == 4
    assert manifest["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "labs-k8s-drill"


def test_parse_etcd_status_tolerates_partial_output() -> None:
    assert parse_etcd_status("", "", "") == EtcdStatus(0, 0, 0, None)
    status = parse_etcd_status('{"members": [{}, {}, {}]}', '[{"health": true}]\nError: unhealthy cluster', "[]")
    assert status == EtcdStatus(members=3, healthy=1, leaders=0) and not status.has_quorum


class _FakeApi(BaseHTTPRequestHandler):
    ready = True

    def do_GET(self) -> None:
        if self.path.startswith("/readyz"):
            body, code = (b"ok", 200) if _FakeApi.ready else (b"[-]etcd failed", 500)
        elif self.path.startswith("/api/v1/nodes/"):
            body = json.dumps({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}).encode()
            code = 200
        else:
            body, code = b"{}", 404
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_real_kubectl_against_a_loopback_api() -> None:
    """The real kubectl accepts KubectlCluster's flags and reaches the server it is given."""
    require_tool("kubectl")
    server = HTTPServer(("127.0.0.1", 0), _FakeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = textwrap.dedent(
        """\
        apiVersion: v1
        kind: Config
        clusters: [{name: lab, cluster: {server: "https://10.3.60.100:6443"}}]
        users: [{name: admin, user: {token: test-token}}]
        contexts: [{name: lab, context: {cluster: lab, user: admin}}]
        current-context: lab
        """
    )
    try:
        with KubectlCluster(kubeconfig, f"http://127.0.0.1:{server.server_port}") as cluster:
            assert cluster.api_answers() is True
            assert cluster.node_ready(W1) is True
            _FakeApi.ready = False
            assert cluster.api_answers() is False
    finally:
        _FakeApi.ready = True
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("scenario", "says"),
    [
        ("worker", "1 worker(s): the test pods have nowhere else to go"),
        ("drain", "1 worker(s): the test pods have nowhere else to go"),
    ],
)
def test_dry_run_refuses_what_the_live_run_refuses(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, lab_namespace: dict, scenario: str, says: str
) -> None:
    """A one-worker lab (labs-k8s:kubernetes.allowSingleWorker) planned "2 nginx pods" in --dry-run
    while the live drill refuses it: the plan says the refusal instead, with exit status 2."""
    import components.tools.offline
    from components.config import load_lab_config

    lab_namespace["nodes"]["workers"]["hosts"].pop()
    lab_namespace["kubernetes"]["allowSingleWorker"] = True
    lab = load_lab_config(lab_namespace)
    monkeypatch.setattr(components.tools.offline, "lab_config_from_stack", lambda stack: lab)
    assert components_main(["drill", scenario, "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert f"DRY RUN: the {scenario} drill would refuse stack 'labs': {says}" in captured.err
    assert "nginx pods" not in captured.out
    assert components_main(["drill", "control-plane", "--dry-run"]) == 0  # three control planes: planned


def test_a_live_drill_needs_its_stack_named_and_stack_is_taken_from_the_environment(tmp_path: Path) -> None:
    """A live drill powers VMs off: it defaulted to the example `labs` and ignored an exported STACK
    (issue 33). Now it refuses without one and takes $STACK as the Makefile does; a dry run still
    falls back to the example."""
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}  # no pulumi CLI: a live run stops at load_inputs

    def drill(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "components", "drill", *args],
            cwd=REPO,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    unnamed = drill("worker")
    assert unnamed.returncode == 2
    assert "which stack?" in unnamed.stderr and "--stack <your site's stack>" in unnamed.stderr
    assert "Pulumi CLI" not in unnamed.stderr  # refused before anything is asked of the stack
    exported = drill("worker", STACK="labs")
    assert exported.returncode == 2 and "the Pulumi CLI is not on PATH" in exported.stderr
    dry = drill("balancer", "--dry-run", STACK="labs")
    assert dry.returncode == 0 and "on stack labs" in dry.stdout
    missing = drill("balancer", "--dry-run", STACK="nosuchsite")
    assert missing.returncode != 0 and "Pulumi.nosuchsite.yaml" in missing.stderr
