"""The vCenter side of a drill, over components.vsphere (the only pyvmomi module).

A drill only ever touches VMs of its own stack: a VM with the lab's name but without this
stack's tag (extraConfig guestinfo.labs-k8s.stack) is refused, never powered off.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from components import vsphere as vs


class VCenterMachines:
    """Power and guest-address questions about the stack's VMs, by VM name."""

    def __init__(self, si: Any, stack: str, datacenter: str | None = None, task_timeout_s: float = 300) -> None:
        self.si = si
        self.stack = stack
        self.task_timeout_s = task_timeout_s
        self._dc = vs.find_datacenter(si, datacenter) if datacenter else None
        self._vms: dict[str, Any] = {}

    def vm(self, name: str) -> Any:
        if name not in self._vms:
            self._vms[name] = vs.get_vm(self.si, name, self._dc)
        return self._vms[name]

    def problems(self, names: Iterable[str]) -> list[str]:
        """Why these VMs cannot be drilled: missing, not this stack's, or not running."""
        found: list[str] = []
        for name in names:
            try:
                vm = self.vm(name)
            except vs.VSphereError as exc:
                found.append(str(exc))
                continue
            owner = vs.vm_stack(vm)
            if owner != self.stack:
                who = f"stack {owner!r}" if owner else "no stack (untagged)"
                found.append(f"VM {name!r} belongs to {who}, not to stack {self.stack!r}: a drill never touches it")
                continue
            state = vs.power_state(vm)
            if state != "poweredOn":
                found.append(f"VM {name!r} is {state} in vCenter")
        return found

    def power_state(self, name: str) -> str:
        return vs.power_state(self.vm(name))

    def power_off(self, name: str) -> None:
        """Hard power-off (no guest shutdown): what a host failure looks like to the guest."""
        vs.power_off(self.vm(name), timeout_s=self.task_timeout_s)

    def power_on(self, name: str) -> None:
        vs.power_on(self.vm(name), timeout_s=self.task_timeout_s)

    def guest_ips(self, name: str) -> set[str]:
        """Addresses VMware Tools reports; nothing for a VM that is not running."""
        vm = self.vm(name)
        if vs.power_state(vm) != "poweredOn":
            return set()
        return vs.vm_guest_ips(vm)

    def vip_holders(self, balancers: Iterable[str], vip: str) -> list[str]:
        """The running balancers whose guest addresses include ``vip`` (exactly one when healthy)."""
        return sorted(name for name in balancers if vip in self.guest_ips(name))
