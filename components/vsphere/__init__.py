"""Every conversation with vCenter that this project has, in one package (pyvmomi).

Nothing else in the project imports pyVmomi: the Pulumi program uses the
pulumi-vsphere provider for the VMs themselves and calls in here for what the
provider cannot do (golden template build, preflight, drills). Inputs are plain
dataclasses and primitives defined here, so the package stays independent of
the pydantic config model.

Split by concern, as cluster-api-provider-vsphere's pkg/services/govmomi is:
- errors:     the exceptions, with messages meant for the user
- session:    login/logout, TLS trust, tasks, bulk property reads
- inventory:  datacenter/cluster/datastore/network/folder/pool/VM lookups, stack tags
- vm:         power state and deletion of a VM
- datastore:  datastore directories and uploads
- template:   the golden template's builder VM, conversion and hardware check
- preflight:  can this vCenter host the stack
- drills:     what failure drills read (guest addresses)

Callers use the names re-exported here (``from components import vsphere``),
never the submodules, so a function can move between them freely.
"""

from __future__ import annotations

from components.vsphere.datastore import (
    delete_datastore_file,
    make_datastore_dir,
    remove_empty_datastore_dir,
    upload_to_datastore,
)
from components.vsphere.drills import vm_guest_ips
from components.vsphere.errors import (
    AmbiguousError,
    NotFoundError,
    TaskError,
    VSphereError,
    VSphereTimeoutError,
)
from components.vsphere.inventory import (
    STACK_TAG_KEY,
    find_cluster,
    find_datacenter,
    find_datastore,
    find_network,
    find_resource_pool,
    find_vm,
    find_vm_by_uuid,
    find_vm_folder,
    get_vm,
    inventory_path,
    stack_tag,
    vm_ips,
    vm_stack,
)
from components.vsphere.preflight import (
    AntiAffinityRule,
    Finding,
    PlannedVm,
    PreflightReport,
    PreflightSpec,
    check_rules,
    preflight,
)
from components.vsphere.session import (
    Endpoint,
    GiB,
    ServerAddress,
    collect_properties,
    connect,
    disconnect,
    parse_server,
    session,
    wait_for_task,
)
from components.vsphere.template import (
    DEBIAN12_GUEST_ID,
    GUEST_ID_FALLBACKS,
    BuilderVm,
    BuilderVmSpec,
    Firmware,
    HardwareProblem,
    attach_iso,
    choose_guest_id,
    create_builder_vm,
    detach_iso,
    mark_as_template,
    supported_guest_ids,
    template_uuid,
    verify_template_hardware,
    wait_for_power_off,
)
from components.vsphere.vm import PowerState, destroy_vm, power_off, power_on, power_state, wait_for_power_state

__all__ = [
    "DEBIAN12_GUEST_ID",
    "GUEST_ID_FALLBACKS",
    "STACK_TAG_KEY",
    "AmbiguousError",
    "AntiAffinityRule",
    "BuilderVm",
    "BuilderVmSpec",
    "Endpoint",
    "Finding",
    "Firmware",
    "GiB",
    "HardwareProblem",
    "NotFoundError",
    "PlannedVm",
    "PowerState",
    "PreflightReport",
    "PreflightSpec",
    "ServerAddress",
    "TaskError",
    "VSphereError",
    "VSphereTimeoutError",
    "attach_iso",
    "check_rules",
    "choose_guest_id",
    "collect_properties",
    "connect",
    "create_builder_vm",
    "delete_datastore_file",
    "destroy_vm",
    "detach_iso",
    "disconnect",
    "find_cluster",
    "find_datacenter",
    "find_datastore",
    "find_network",
    "find_resource_pool",
    "find_vm",
    "find_vm_by_uuid",
    "find_vm_folder",
    "get_vm",
    "inventory_path",
    "make_datastore_dir",
    "mark_as_template",
    "parse_server",
    "power_off",
    "power_on",
    "power_state",
    "preflight",
    "remove_empty_datastore_dir",
    "session",
    "stack_tag",
    "supported_guest_ids",
    "template_uuid",
    "upload_to_datastore",
    "verify_template_hardware",
    "vm_guest_ips",
    "vm_ips",
    "vm_stack",
    "wait_for_power_off",
    "wait_for_power_state",
    "wait_for_task",
]
