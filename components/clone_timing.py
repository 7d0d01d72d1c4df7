"""How long vCenter takes to clone the nodes and zero their disks, and the provider timeouts that follow.

Pure arithmetic over the config, used by the fleet (each clone's own bound) and by config validation
(stack_config.check_api_timeout), which must not import a layer to get it.
"""

from __future__ import annotations

from components.config import LabConfig

# The provider clones, then adds the data disks in one ReconfigVM_Task bounded by its api_timeout
# (terraform-provider-vsphere vsphere/provider.go: "api_timeout", default 5 minutes, env
# VSPHERE_API_TIMEOUT; resource_vsphere_virtual_machine.go resourceVSphereVirtualMachinePostDeployChanges
# -> virtualmachine.Reconfigure(vm, cfgSpec, timeout)). vCenter zeroes an eager-zeroed disk while
# that task runs, and on a timeout the provider "rolls back" by deleting the half-made VM
# (resourceVSphereVirtualMachineRollbackCreate) while vCenter may still be zeroing. All clones run
# at once, so the zeroing shares the datastore's write rate. Assumed: storage without zero
# offload (no VAAI WRITE_SAME) sustaining this much for all of them together.
ASSUMED_ZEROING_MIB_PER_SECOND = 50
PROVIDER_DEFAULT_API_TIMEOUT_MINUTES = 5
# The clone task itself has its own bound, clone.timeout (default 30 minutes, at least 10); a
# change of it is not ForceNew (resource_vsphere_virtual_machine.go: "timeout does not need to
# ForceNew"), so it can follow the disk sizes without replacing a VM.
PROVIDER_DEFAULT_CLONE_TIMEOUT_MINUTES = 30


def _minutes_to_write(gib: int) -> int:
    return -(-gib * 1024 // (ASSUMED_ZEROING_MIB_PER_SECOND * 60)) + 5  # rounded up, +5 for the rest


def _data_gib(lab: LabConfig, created: list[str] | None) -> int:
    return sum(node.data_disk_gib for node in lab.all_nodes if created is None or node.name in created)


def api_timeout_minutes(lab: LabConfig, created: list[str] | None = None) -> int:
    """What vsphere:apiTimeout must be at least: the data disks of every VM this run creates
    (``created``; None = every node, a new stack) zeroed at once, after their clones."""
    data = _data_gib(lab, created)
    return max(PROVIDER_DEFAULT_API_TIMEOUT_MINUTES, _minutes_to_write(data) if data else 0)


def clone_timeout_minutes(lab: LabConfig) -> int:
    """clone.timeout: every full clone copies the template's eager-zeroed disk at the same time."""
    return max(PROVIDER_DEFAULT_CLONE_TIMEOUT_MINUTES, _minutes_to_write(lab.template.disk_gib * len(lab.all_nodes)))


def api_timeout_problem(
    lab: LabConfig, value: str | None, source: str, stack: str, created: list[str] | None = None
) -> tuple[bool, str] | None:
    """vsphere:apiTimeout (or VSPHERE_API_TIMEOUT) too short for the disks: (error?, the fix), else None.

    An error when it is shorter than the largest single data disk needs (that VM fails whatever
    else runs), a warning when it is shorter than every created VM's disks at once need (an
    estimate: how many clones run at once is the engine's --parallel).

    The stack config of the default provider, not an explicit provider: a resource moved to an
    explicit provider gets a new provider reference, and the engine compares that provider's
    config with the old one's; the default provider keeps its reference, and a changed
    apiTimeout is an update of it (pulumi-terraform-bridge pkg/tfbridge/provider.go DiffConfig:
    only a ForceNew config field replaces, and api_timeout is not one).
    """
    needed = api_timeout_minutes(lab, created)
    fix = f"pulumi config set --stack {stack} vsphere:apiTimeout {needed}"
    if value is None or value.strip() == "":
        minutes, shown = PROVIDER_DEFAULT_API_TIMEOUT_MINUTES, "not set (the provider's default: 5 minutes)"
    else:
        try:
            minutes, shown = int(value.strip()), f"{value.strip()} minutes"
        except ValueError:
            return True, f"{source}: {value!r} is not a number of minutes; {fix}"
    if minutes >= needed:
        return None
    largest = max((n.data_disk_gib for n in lab.all_nodes if created is None or n.name in created), default=0)
    floor = _minutes_to_write(largest) if largest else 0
    data = _data_gib(lab, created)
    return minutes < floor, (
        f"{source}: {shown} is too short for the clones' {data} GiB of eager-zeroed data disks, which vCenter "
        f"zeroes inside the provider's reconfigure after each clone (about {needed} minutes at "
        f"{ASSUMED_ZEROING_MIB_PER_SECOND} MiB/s for all of them at once, {floor} for the largest alone). On a "
        f"timeout the provider deletes the half-made VM and the `up` fails (docs/troubleshooting.md). Set at "
        f"least {needed}: {fix}"
    )
