"""Failover of the balancer pair in a network-namespace lab (tests/netns_lab.py): real HAProxy
and Keepalived with the rendered configs, three TLS apiserver stand-ins, a client polling the
VIP every 100 ms. The goals are those of docs/load-balancers.md; bench/lb_failover.py prints
the same scenarios as a table.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns_lab
from tests.labs import make_lab_config
from tests.netns_lab import NetnsLab, ScenarioResult
from tests.requirements import require_root, require_tool

pytestmark = pytest.mark.integration

LOST_OR_FROZEN_GOAL = 3.7
HAPROXY_DEAD_GOAL = 2.5


def _require_lab_tools() -> None:
    require_root()
    require_tool(*netns_lab.TOOLS, "setpriv")


@pytest.fixture(scope="module")
def lab() -> Iterator[NetnsLab]:
    _require_lab_tools()
    with NetnsLab(make_lab_config()) as running:
        yield running


def _explain(lab: NetnsLab, result: ScenarioResult) -> str:
    return f"{result.summary()}\nobserved: {result.observed}\n{lab.log_tail()}"


def test_vip_on_lb1_round_robin_over_all_apiservers(lab: NetnsLab) -> None:
    result = netns_lab.scenario_baseline(lab)
    assert result.failed == 0, _explain(lab, result)
    assert result.requests >= 10, _explain(lab, result)
    names = [n.name for n in lab.cfg.control_planes]
    assert set(result.backends) == set(names), _explain(lab, result)
    # Round robin: counts differ by at most one, and no backend answers twice in a row.
    assert max(result.backends.values()) - min(result.backends.values()) <= 1, _explain(lab, result)
    served = [r.backend for r in lab.records() if result.fault_at <= r.start <= result.window_end]
    assert all(a != b for a, b in itertools.pairwise(served)), served
    samples = [s for s in lab.samples if result.fault_at <= s.at <= result.window_end]
    assert samples and all(s.holders == {"lb1"} for s in samples)
    # One HAProxy and one Keepalived (parent + VRRP child) per balancer namespace.
    for key in lab.balancer_keys:
        assert len(lab.running_in(key, "haproxy")) == 1, key
        assert len(lab.running_in(key, "keepalived")) == 2, key


def test_haproxy_killed_on_lb1_moves_the_vip_to_lb2(lab: NetnsLab) -> None:
    result = netns_lab.scenario_haproxy_dead(lab)
    # Per namespace: lb1 lost its HAProxy, lb2's still runs (a global pidof would see it).
    assert result.observed["haproxy@lb1"] == 0 and result.observed["haproxy@lb2"] == 1, _explain(lab, result)
    assert result.observed["vip_on"] == ["lb2"], _explain(lab, result)
    assert result.failed > 0, "the fault was never seen by the client: the scenario measured nothing"
    assert result.recovered_after is not None and result.recovered_after <= HAPROXY_DEAD_GOAL, _explain(lab, result)
    assert result.dual_vip_samples == 0, _explain(lab, result)
    assert not result.notes, _explain(lab, result)  # and it went back to lb1
    # Failback moves the VIP under in-flight requests: at most the one in flight may break.
    assert result.failback_failed is not None and result.failback_failed <= 1, _explain(lab, result)


def test_lb1_frozen_lb2_takes_over(lab: NetnsLab) -> None:
    result = netns_lab.scenario_frozen(lab)
    assert result.failed > 0, "the fault was never seen by the client: the scenario measured nothing"
    assert result.recovered_after is not None and result.recovered_after <= LOST_OR_FROZEN_GOAL, _explain(lab, result)
    assert result.observed["vip_on"] == ["lb1", "lb2"], "a frozen Keepalived keeps its VIP configured"
    # Once lb1 runs again it takes the VIP back and lb2 drops it: never both after the thaw.
    assert result.dual_vip_samples == 0, _explain(lab, result)
    assert [n for n in result.notes if not n.startswith("froze")] == [], _explain(lab, result)
    assert result.failback_failed is not None and result.failback_failed <= 1, _explain(lab, result)


def test_lb1_link_down_and_back(lab: NetnsLab) -> None:
    result = netns_lab.scenario_link_down(lab)
    assert result.failed > 0, "the fault was never seen by the client: the scenario measured nothing"
    assert result.recovered_after is not None and result.recovered_after <= LOST_OR_FROZEN_GOAL, _explain(lab, result)
    assert result.observed["vip_on"] == ["lb2"], _explain(lab, result)  # lb1 dropped it in FAULT
    assert result.vip_samples > 100, "too few samples to claim the VIP was never on both"
    assert result.dual_vip_samples == 0, _explain(lab, result)
    assert not result.notes, _explain(lab, result)  # the VIP went back to lb1
    assert result.failback_failed is not None and result.failback_failed <= 1, _explain(lab, result)


def test_apiserver_killed_leaves_rotation_without_failed_requests(lab: NetnsLab) -> None:
    result = netns_lab.scenario_apiserver_dead(lab, "m01", signal.SIGTERM)
    dead = lab.apiserver_names["m01"]
    assert result.requests >= 30, _explain(lab, result)
    assert result.failed == 0, _explain(lab, result)
    assert any(n.startswith("marked DOWN after") for n in result.notes), _explain(lab, result)
    assert "served by it after DOWN: 0" in result.notes, _explain(lab, result)
    # The others carry the load (the stopped one may still finish the request in flight at the stop).
    assert set(result.backends) - {dead} == {n.name for n in lab.cfg.control_planes} - {dead}, _explain(lab, result)
    assert result.backends[dead] <= 1, _explain(lab, result)
    assert "did not come back UP" not in result.notes, _explain(lab, result)


def test_cluster_ssh_port_reaches_the_first_healthy_control_plane(lab: NetnsLab) -> None:
    """The cluster-wide steps' SSH (VIP:2222, `balance first`): the first control plane whose
    apiserver is healthy; the next one while it is not; the first again when it is back."""
    from components.rendering.lb import CONTROL_PLANE_SSH_PORT

    for key in lab.apiserver_keys:
        lab.start_ssh_banner(key)
    first, second = (lab.apiserver_names[k] for k in lab.apiserver_keys[:2])
    assert wait_until_banner(lab, f"SSH-2.0-{first}", 10), lab.log_tail()
    assert {lab.ssh_banner_via_vip(CONTROL_PLANE_SSH_PORT) for _ in range(5)} == {f"SSH-2.0-{first}"}
    lab.stop_apiserver("m01", signal.SIGKILL)
    try:
        # Health check inter 2s fall 3: DOWN within about 6 s, sessions go to the next one.
        assert wait_until_banner(lab, f"SSH-2.0-{second}", 15), lab.log_tail()
    finally:
        lab.start_apiserver("m01")
        assert lab.wait_steady(timeout=20), lab.log_tail()
    assert wait_until_banner(lab, f"SSH-2.0-{first}", 15), lab.log_tail()


def test_cluster_ssh_port_skips_a_control_plane_whose_sshd_is_down(lab: NetnsLab) -> None:
    """A control plane whose apiserver is healthy but whose sshd is down gets no cluster-wide step:
    the session is redispatched to the next one at once (before the check notices), then the
    check on port 22 marks it DOWN; it is first again once sshd is back."""
    from components.rendering.lb import CONTROL_PLANE_SSH_PORT

    for key in lab.apiserver_keys:
        lab.start_ssh_banner(key)
    first_key = lab.apiserver_keys[0]
    first, second = (lab.apiserver_names[k] for k in lab.apiserver_keys[:2])
    assert wait_until_banner(lab, f"SSH-2.0-{first}", 15), lab.log_tail()
    lab.stop_ssh_banner(first_key)
    try:
        # Still UP for HAProxy (checks every 2 s, fall 3): the refused connection is redispatched.
        assert lab.ssh_banner_via_vip(CONTROL_PLANE_SSH_PORT) == f"SSH-2.0-{second}", lab.log_tail()
        assert netns_lab.wait_until(lambda: ssh_server_state(lab, first) == "DOWN", 15), lab.log_tail()
        assert lab.server_states(lab.balancer_keys[0])[first] == "UP", "its apiserver is healthy"
        assert {lab.ssh_banner_via_vip(CONTROL_PLANE_SSH_PORT) for _ in range(5)} == {f"SSH-2.0-{second}"}
    finally:
        lab.start_ssh_banner(first_key)
    assert wait_until_banner(lab, f"SSH-2.0-{first}", 15), lab.log_tail()


def ssh_server_state(lab: NetnsLab, server: str) -> str:
    """The state of one server of `listen control-plane-ssh` on the first balancer."""
    return lab.server_states(lab.balancer_keys[0], proxy="control-plane-ssh").get(server, "")


def wait_until_banner(lab: NetnsLab, banner: str, timeout: float) -> bool:
    from components.rendering.lb import CONTROL_PLANE_SSH_PORT

    return netns_lab.wait_until(lambda: lab.ssh_banner_via_vip(CONTROL_PLANE_SSH_PORT) == banner, timeout, 0.5)


def test_leftovers_of_a_crashed_run_are_cleaned() -> None:
    _require_lab_tools()
    dead = subprocess.Popen(["true"])
    dead.wait()  # a PID that no longer runs: the "crashed" run
    ns = f"{netns_lab.PREFIX}{dead.pid}_1-lb1"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"])
    try:
        assert netns_lab.wait_until(lambda: sleeper.pid in netns_lab.netns_pids(ns), 5)
        removed = netns_lab.cleanup_leftovers()
        assert ns in removed
        assert ns not in netns_lab.netns_list()
        assert sleeper.wait(timeout=5) == -signal.SIGKILL
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def test_teardown_removes_everything_even_when_the_test_fails() -> None:
    _require_lab_tools()
    cfg = make_lab_config()
    started: list[int] = []
    namespaces: list[str] = []
    with pytest.raises(RuntimeError, match="simulated failure"), NetnsLab(cfg) as running:
        started = [p.pid for p in running.procs.values()]
        namespaces = [h.ns for h in running.hosts.values()] + [running.bridge_ns]
        workdir = running.workdir
        raise RuntimeError("simulated failure")
    assert started and namespaces
    left = set(netns_lab.netns_list()) & set(namespaces)
    assert not left, left
    time.sleep(0.2)
    alive = [
        pid
        for pid in started
        if os.path.exists(f"/proc/{pid}") and not Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    ]
    assert not alive, alive
    assert not workdir.exists()
