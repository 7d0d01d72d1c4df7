"""Power state and deletion of one VM (template build and drills both use these)."""

from __future__ import annotations

import time
from typing import Literal

from pyVmomi import vim

from components.vsphere.errors import VSphereTimeoutError
from components.vsphere.session import present, wait_for_task

PowerState = Literal["poweredOn", "poweredOff", "suspended"]


def power_state(vm: vim.VirtualMachine) -> str:
    """'poweredOn', 'poweredOff' or 'suspended'."""
    return str(vm.runtime.powerState)


def power_on(vm: vim.VirtualMachine, timeout_s: float = 300) -> None:
    """Power on; no-op when already on (vCenter would fault InvalidPowerState)."""
    if power_state(vm) == "poweredOn":
        return
    wait_for_task(vm.PowerOnVM_Task(), f"powering on VM {vm.name!r}", timeout_s)


def power_off(vm: vim.VirtualMachine, timeout_s: float = 300) -> None:
    """Hard power off (pulls the plug, no guest shutdown); no-op when off."""
    if power_state(vm) == "poweredOff":
        return
    wait_for_task(vm.PowerOffVM_Task(), f"powering off VM {vm.name!r}", timeout_s)


def wait_for_power_state(vm: vim.VirtualMachine, state: PowerState, timeout_s: float, poll_s: float = 2.0) -> None:
    """Poll until the VM reaches ``state``; VSphereTimeoutError says what it was."""
    deadline = time.monotonic() + timeout_s
    current = power_state(vm)
    while current != state:
        if time.monotonic() >= deadline:
            raise VSphereTimeoutError(f"VM {vm.name!r} is still {current} after {timeout_s:g}s waiting for {state}")
        time.sleep(poll_s)
        current = power_state(vm)


def destroy_vm(vm: vim.VirtualMachine, timeout_s: float = 600) -> None:
    """Power off (if running) and delete the VM or template with its files."""
    name = vm.name  # read before the VM is gone: vcsim deletes before the task returns
    if not present(vm.config, "VirtualMachine.config").template:
        power_off(vm, timeout_s)
    wait_for_task(vm.Destroy_Task(), f"deleting VM {name!r}", timeout_s)
