"""What a failure drill (components/tools/drills) reads from vCenter."""

from __future__ import annotations

from pyVmomi import vim

from components.vsphere.inventory import vm_ips


def vm_guest_ips(vm: vim.VirtualMachine) -> set[str]:
    """Every address VMware Tools reports for the guest (guest.ipAddress and each NIC's).

    A Keepalived VIP is a secondary address on the balancer's NIC, so the balancer
    holding it reports it here. Tools refresh this every 30 s by default
    (guestinfo poll-interval), so a VIP move shows up with that much delay at most.
    A powered-off VM reports nothing on vCenter (vcsim keeps the last values).
    """
    guest = vm.guest
    if guest is None:
        return set()
    return vm_ips({"guest.ipAddress": guest.ipAddress, "guest.net": guest.net})
