"""Is `labs-k8s:network.cidr` the node port group's subnet? What vCenter already knows, before anything is built.

The nodes get static addresses, so a subnet kept from the example (10.3.60.0/24) on another
network shows up only at the first readiness step, 30-45 minutes in (the template build and the
clones come first). VMware Tools on the VMs already on that port group report their addresses
(guest.net: the NIC's port group and its IPs); if some do and none is inside `network.cidr`, the
lab's addresses are very likely on the wrong subnet. A port group without reporting VMs proves
nothing, and one that carries several subnets may have VMs outside it: so this is a warning.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from pyVmomi import vim

from components.vsphere.session import collect_properties

SHOWN = 3  # addresses quoted in the warning


def port_group_addresses(rows: Iterable[Mapping[str, Any]], network: str) -> dict[str, str]:
    """IPv4 address -> VM name, for every address Tools report on a NIC of port group `network`."""
    found: dict[str, str] = {}
    for props in rows:
        for nic in props.get("guest.net") or []:
            if getattr(nic, "network", None) != network:
                continue
            for text in getattr(nic, "ipAddress", None) or []:
                try:
                    address = ipaddress.ip_address(text)
                except ValueError:
                    continue
                if address.version == 4 and not address.is_link_local and not address.is_loopback:
                    found.setdefault(str(address), str(props.get("name", "?")))
    return found


def subnet_warning(addresses: Mapping[str, str], network: str, cidr: str) -> str | None:
    """The warning when VMs on the port group report addresses, and none inside `cidr`."""
    subnet = ipaddress.ip_network(cidr, strict=False)
    if not addresses or any(ipaddress.ip_address(a) in subnet for a in addresses):
        return None
    sample = ", ".join(f"{address} ({vm})" for address, vm in sorted(addresses.items())[:SHOWN])
    more = f" and {len(addresses) - SHOWN} more" if len(addresses) > SHOWN else ""
    return (
        f"VMs on port group {network!r} report {sample}{more}, none inside labs-k8s:network.cidr {subnet}: "
        "if that is not the port group's subnet, the nodes' static addresses will not answer and the lab "
        "fails at its first readiness step, 30-45 minutes in. Set labs-k8s:network.cidr, network.gateway, "
        "the node addresses and loadBalancer.vip to that port group's subnet (README, \"What to change for "
        'your site")'
    )


def check_node_subnet(si: vim.ServiceInstance, network: str, cidr: str) -> str | None:
    root = si.RetrieveContent().rootFolder
    rows = (props for _, props in collect_properties(si, root, vim.VirtualMachine, ["name", "guest.net"]))
    return subnet_warning(port_group_addresses(rows, network), network, cidr)
