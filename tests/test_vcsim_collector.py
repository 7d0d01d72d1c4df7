"""The session's default PropertyCollector of our vcsim (tests/tools/vcsim/collector.go) answers
WaitForUpdatesEx by the version its caller passes, as the vSphere API defines it.

The vSphere provider waits for its VM tasks on that one collector from as many goroutines as the
engine runs steps (govmomi object.Task.WaitForResultEx). The simulator's own collector handed all
updates to whichever wait polled first, so at any --parallel above 1 the other waits never saw
their task finish (docs/testing.md, "Parallelism against vcsim"). These tests wait the same way,
with pyVmomi: a filter each on the session's collector, and WaitForUpdatesEx from the version the
previous call returned.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from pyVmomi import vim, vmodl

from components import vsphere as vs

if TYPE_CHECKING:
    from tests.vcsim import Vcsim

pytest_plugins = ["tests.vcsim"]

# Long enough for a poll of 20 ms many times over; a wait that missed its update waits this long.
DEADLINE_S = 10.0


@pytest.fixture
def sessions(vcsim_factory: Callable[..., Vcsim]) -> Iterator[tuple[vim.ServiceInstance, vim.ServiceInstance]]:
    """The session that waits, and another that changes things (as vCenter's other users do), on
    a simulator with four VMs in its cluster (powered on, as vcsim makes them)."""
    vcsim = vcsim_factory(vms=4)
    waiter = vs.connect(vcsim.host, vcsim.user, vcsim.password, port=vcsim.port, insecure=True)
    actor = vs.connect(vcsim.host, vcsim.user, vcsim.password, port=vcsim.port, insecure=True)
    yield waiter, actor
    vs.disconnect(waiter)
    vs.disconnect(actor)


def powered_on_vms(si: vim.ServiceInstance) -> list[vim.VirtualMachine]:
    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
    try:
        return sorted(
            (vm for vm in view.view if vm.runtime.powerState == vim.VirtualMachine.PowerState.poweredOn),
            key=lambda vm: vm.name,
        )
    finally:
        view.Destroy()


def power_state_filter(collector: vmodl.query.PropertyCollector, vm: vim.VirtualMachine) -> Any:
    spec = vmodl.query.PropertyCollector.FilterSpec(
        objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=vm)],
        propSet=[vmodl.query.PropertyCollector.PropertySpec(type=vim.VirtualMachine, pathSet=["runtime.powerState"])],
    )
    return collector.CreateFilter(spec, True)


def wait_for_power_off(
    collector: vmodl.query.PropertyCollector, vm: vim.VirtualMachine, started: threading.Barrier
) -> float | None:
    """As govmomi's task wait does: its own filter on the shared collector, then WaitForUpdatesEx
    from the version the last call returned, looking only at its own object. Returns how long
    the wait for the change took, or None when it never came."""
    own = power_state_filter(collector, vm)
    try:
        options = vmodl.query.PropertyCollector.WaitOptions(maxWaitSeconds=1)
        version = collector.WaitForUpdatesEx("", options).version  # the current state
        started.wait(timeout=DEADLINE_S)
        begun = time.monotonic()
        while time.monotonic() - begun < DEADLINE_S:
            updates = collector.WaitForUpdatesEx(version, options)
            if updates is None:
                continue
            version = updates.version
            for filter_update in updates.filterSet:
                for object_update in filter_update.objectSet:
                    if object_update.obj != vm:
                        continue  # another wait's object, as govmomi's task wait skips it
                    if any(change.val == "poweredOff" for change in object_update.changeSet):
                        return time.monotonic() - begun
        return None
    finally:
        own.Destroy()


def test_concurrent_waits_on_one_sessions_collector_each_see_their_own_change(
    sessions: tuple[vim.ServiceInstance, vim.ServiceInstance],
) -> None:
    waiter, actor = sessions
    collector = waiter.content.propertyCollector
    vms = powered_on_vms(actor)[:4]
    assert len(vms) == 4, [vm.name for vm in vms]
    started = threading.Barrier(len(vms) + 1)
    seen: dict[str, float | None] = {}

    def wait(vm: vim.VirtualMachine) -> None:
        seen[vm.name] = wait_for_power_off(collector, waiter_vm(waiter, vm), started)

    threads = [threading.Thread(target=wait, args=(vm,)) for vm in vms]
    for thread in threads:
        thread.start()
    started.wait(timeout=DEADLINE_S)
    time.sleep(0.3)  # every wait is in WaitForUpdatesEx now
    for vm in vms:
        vm.PowerOffVM_Task()
    for thread in threads:
        thread.join(DEADLINE_S + 5)
    missed = sorted(name for name, took in seen.items() if took is None)
    assert not missed, f"these waits never saw their VM power off: {missed} (all: {seen})"
    assert len(seen) == len(vms)


def waiter_vm(waiter: vim.ServiceInstance, vm: vim.VirtualMachine) -> vim.VirtualMachine:
    """The same VM, as a managed object of the waiting session's stub."""
    return vim.VirtualMachine(vm._GetMoId(), waiter._stub)


def test_a_version_passed_again_gives_the_same_change_again(
    sessions: tuple[vim.ServiceInstance, vim.ServiceInstance],
) -> None:
    """A non-truncated version "may be passed ... more than once" (vSphere API, UpdateSet): what
    changed since it is computed again, not taken from a queue the first call emptied."""
    waiter, actor = sessions
    collector = waiter.content.propertyCollector
    vm = powered_on_vms(actor)[0]
    own = power_state_filter(collector, waiter_vm(waiter, vm))
    try:
        before = collector.WaitForUpdatesEx("", vmodl.query.PropertyCollector.WaitOptions(maxWaitSeconds=0)).version
        vm.PowerOffVM_Task()
        options = vmodl.query.PropertyCollector.WaitOptions(maxWaitSeconds=5)
        first = collector.WaitForUpdatesEx(before, options)
        again = collector.WaitForUpdatesEx(before, options)
        for updates in (first, again):
            assert updates is not None
            changes = [c.val for f in updates.filterSet for o in f.objectSet for c in o.changeSet]
            assert changes == ["poweredOff"], changes
        # From the newest version nothing has changed: an immediate check returns no update.
        at_once = vmodl.query.PropertyCollector.WaitOptions(maxWaitSeconds=0)
        assert collector.WaitForUpdatesEx(again.version, at_once) is None
    finally:
        own.Destroy()
