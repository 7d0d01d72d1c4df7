"""What the real-engine tests' network namespace holds besides the CLI (tests/pulumi_engine.py).

Started inside the namespace (`ip netns exec NS python -m tests.engine_box ...`), it runs:
- vcsim (tests/tools/build_vcsim.sh's binary) on the namespace's loopback, with the seed's
  inventory (one DRS cluster of three hosts, a shared datastore, the port group) and the lab's VM
  folder, its password read from a file at every login (so a test can rotate it), serving a
  certificate from the lab's own CA (--tls-cert/--tls-key), which the lab's commands trust the
  runbook's way (tests/pulumi_engine.py);
- an HTTP server on the namespace's loopback for the stand-in netinst ISO
  (labs-k8s:template.isoUrl points at it);
- the installer's last step: vcsim runs no guest, so a running builder VM is powered off once
  seen, as the Debian installer does after late_command (tests/test_template_provider.py does the
  same in-process).
It prints one line `BOX {"vcsim": "host:port", "iso_url": ...}` once all three are up, and
stops them on SIGTERM.

With --watch-clones (the lab in a box, tests/lab_box.py) it also reports every clone of the VM
folder whose power state changes, as vCenter sees it: one line `CLONE {"uuid", "name", "state",
"mac", "guestinfo"}` per change, `state` one of poweredOn, poweredOff, gone; `guestinfo` every
`guestinfo.*` key of the VM's extraConfig exactly as the vSphere provider set it (values and
encodings), which is what a clone's VMware tools would hand cloud-init. And it sets each clone's
guest address in vcsim from what the box's VMware Tools report (`apply_guest_addresses`).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pyVmomi import vim, vmodl

from components import vsphere as vs


def start_vcsim(
    binary: str, user: str, password_file: Path, tls: tuple[Path, Path]
) -> tuple[subprocess.Popen[str], str, int]:
    password = password_file.read_text().strip()
    proc = subprocess.Popen(
        [binary, "-l", "127.0.0.1:0", "-username", user, "-password", password,
         "-dc", "1", "-cluster", "1", "-host", "3", "-vm", "0", "-ds", "1", "-pg", "1",
         "-tlscert", str(tls[0]), "-tlskey", str(tls[1])],
        # vcsim's own log (a panic's stack among it) beside the box's, kept with the artifacts.
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(password_file.parent / "vcsim.log", "w"),  # noqa: SIM115
        text=True,
        env={"LABS_K8S_VCSIM_PASSWORD_FILE": str(password_file), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"GOVC_URL=\S+@([^:/]+):(\d+)/", line)
        if match:
            return proc, match.group(1), int(match.group(2))
    raise SystemExit(f"vcsim exited ({proc.wait()}) before printing its URL")


def is_builder(machine: vim.VirtualMachine) -> bool:
    """The template's builder: the one VM that boots the install ISO the template layer uploaded
    (labs-k8s-iso/...). The clones, which the real vSphere provider powers on, keep running."""
    if machine.config is None or machine.config.template:
        return False
    return any(
        isinstance(device, vim.vm.device.VirtualCdrom)
        and isinstance(device.backing, vim.vm.device.VirtualCdrom.IsoBackingInfo)
        and "] labs-k8s-iso/" in (device.backing.fileName or "")
        for device in machine.config.hardware.device
    )


def play_installer(host: str, port: int, user: str, password_file: Path, stop: threading.Event) -> None:
    """Power off a running builder, as the installer does after late_command. While a file
    `installer-hold` sits beside the password file, the installer is still at work: nothing is
    powered off (a test kills the CLI mid-build that way)."""
    si = None
    hold = password_file.parent / "installer-hold"
    # Whether each running VM is the builder, read once per VM: its ISO is attached before it
    # powers on (components/vsphere/template.py attach_iso), and a clone never gets one. Reading
    # every VM's whole config three times a second (`machine.config`: its user-data included) kept
    # this process busy on the CPU the box's CLI and hosts share (docs/testing.md, the bench).
    builders: dict[str, bool] = {}
    while not stop.wait(0.3):
        if hold.exists():
            continue
        try:
            if si is None:
                # Unverified on purpose: this is the harness playing the installer (the box runs
                # outside the lab's trust store); the program and the provider verify vcsim.
                si = vs.connect(host, user, password_file.read_text().strip(), port=port, insecure=True)
            rows = vs.collect_properties(si, si.content.rootFolder, vim.VirtualMachine, ["runtime.powerState"])
            builders = {machine._moId: builders[machine._moId] for machine, _ in rows if machine._moId in builders}
            for machine, props in rows:
                if str(props.get("runtime.powerState")) != "poweredOn":
                    continue
                try:
                    if machine._moId not in builders:
                        builders[machine._moId] = is_builder(machine)
                    if builders[machine._moId]:
                        time.sleep(0.3)
                        vs.power_off(machine)
                except vmodl.fault.ManagedObjectNotFound:
                    continue
        except (vs.VSphereError, vim.fault.NotAuthenticated, OSError):
            si = None  # a rotated password, or vcsim restarting: log in again


# The clone's properties the box needs: its identity, power, NIC and guestinfo.
CLONE_PROPERTIES = ["name", "config.uuid", "config.template", "runtime.powerState", "config.extraConfig",
                    "config.hardware.device"]  # fmt: skip


def clone_facts(props: dict[str, object], vm: str = "") -> dict[str, object] | None:
    """A clone's line for the box, or None for what is not a clone (a template, the builder, a VM
    without our user-data)."""
    if props.get("config.template") or "config.uuid" not in props:
        return None
    guestinfo = {
        option.key: str(option.value)
        for option in props.get("config.extraConfig") or []
        if option.key.startswith("guestinfo.")
    }
    if "guestinfo.metadata" not in guestinfo:
        return None
    macs = [
        device.macAddress
        for device in props.get("config.hardware.device") or []
        if isinstance(device, vim.vm.device.VirtualEthernetCard)
    ]
    return {
        # `vm`, the managed object id, tells one VM from another: vcsim derives config.uuid from
        # the VM's path (govmomi simulator virtual_machine.go, internal.OID(VmPathName)), so a
        # replaced VM has the old one's uuid, where vCenter gives a new VM a new one.
        "vm": vm,
        "uuid": props["config.uuid"],
        "name": props["name"],
        "state": str(props.get("runtime.powerState")),
        "mac": macs[0] if macs else "",
        "guestinfo": guestinfo,
    }


# What each poll reads of every VM: enough to see one come, go, or change power state. A VM's
# extraConfig (its user-data, tens of KB) and devices are read only when that changes: reading them
# for every VM twice a second kept this process at half a core and vcsim at a fifth (pyvmomi parses
# every byte), CPU the hosts and the CLI share on the box (docs/testing.md, the bench).
CLONE_STATE_PROPERTIES = ["config.uuid", "config.template", "runtime.powerState"]


def object_properties(si: vim.ServiceInstance, obj: vim.ManagedEntity, props: list[str]) -> dict[str, object]:
    """`props` of one object in one round trip ({} when it is gone)."""
    spec = vmodl.query.PropertyCollector.FilterSpec(
        objectSet=[vmodl.query.PropertyCollector.ObjectSpec(obj=obj, skip=False)],
        propSet=[vmodl.query.PropertyCollector.PropertySpec(type=type(obj), pathSet=props)],
    )
    result = si.content.propertyCollector.RetrievePropertiesEx([spec], vmodl.query.PropertyCollector.RetrieveOptions())
    if result is None or not result.objects:
        return {}
    return {prop.name: prop.val for prop in result.objects[0].propSet or []}


def watch_clones(host: str, port: int, user: str, password_file: Path, stop: threading.Event) -> None:
    """Print a CLONE line whenever a clone is powered on or off, or goes (module docstring)."""
    si = None
    known: dict[str, dict[str, object]] = {}
    # Per VM: its CLONE_STATE_PROPERTIES when last read whole, and its facts then (None: not a clone).
    read: dict[str, tuple[tuple[object, ...], dict[str, object] | None]] = {}
    addresses = password_file.parent / "guest-addresses.json"
    applied: dict[str, str] = {}
    while not stop.wait(0.5):
        try:
            if si is None:
                si = vs.connect(host, user, password_file.read_text().strip(), port=port, insecure=True)
            rows = vs.collect_properties(si, si.content.rootFolder, vim.VirtualMachine, CLONE_STATE_PROPERTIES)
            for machine, props in rows:
                mark = tuple(str(props.get(name)) for name in CLONE_STATE_PROPERTIES)
                if machine._moId not in read or read[machine._moId][0] != mark:
                    whole = object_properties(si, machine, CLONE_PROPERTIES)
                    read[machine._moId] = (mark, clone_facts(whole, machine._moId))
        except (vs.VSphereError, vim.fault.NotAuthenticated, vmodl.fault.ManagedObjectNotFound, OSError):
            si = None
            continue
        present = {machine._moId for machine, _ in rows}
        read = {vm: entry for vm, entry in read.items() if vm in present}
        seen = {vm: facts for vm, (_, facts) in read.items() if facts is not None}
        # What went first: a VM replaced between two polls (deleted, then a new one under the same
        # name, address and MAC) leaves before the new one comes.
        for vm in known.keys() - seen.keys():
            gone = {"vm": vm, "uuid": known[vm]["uuid"], "name": known[vm]["name"], "state": "gone"}
            print("CLONE " + json.dumps(gone), flush=True)
        for vm, facts in seen.items():
            if known.get(vm, {}).get("state") != facts["state"]:
                print("CLONE " + json.dumps(facts), flush=True)
        known = seen
        applied = apply_guest_addresses(addresses, {m._moId: m for m, _ in rows}, applied)


def apply_guest_addresses(
    source: Path, machines: dict[str, vim.VirtualMachine], applied: dict[str, str]
) -> dict[str, str]:
    """What the box's VMware Tools report (tests/lab_box.py `report_guest_addresses`: {VM: address}),
    set as each VM's guest.ipAddress through vcsim's SET.guest.ipAddress extraConfig key (the
    simulator sets the property and keeps nothing in the VM's extraConfig: govmomi
    simulator/virtual_machine.go applyExtraConfig). Returns what is now applied."""
    try:
        wanted = json.loads(source.read_text())
    except (OSError, ValueError):
        return applied
    done = {vm: ip for vm, ip in applied.items() if vm in machines}
    for vm, ip in wanted.items():
        if vm not in machines or done.get(vm) == ip:
            continue
        spec = vim.vm.ConfigSpec(extraConfig=[vim.option.OptionValue(key="SET.guest.ipAddress", value=ip)])
        try:
            vs.wait_for_task(machines[vm].ReconfigVM_Task(spec), f"guest address of {vm}")
        except (vs.VSphereError, vmodl.fault.ManagedObjectNotFound, vim.fault.TaskInProgress):
            continue
        done[vm] = ip
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vcsim", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--password-file", type=Path, required=True)
    parser.add_argument("--iso-dir", type=Path, required=True)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--tls-cert", type=Path, required=True, help="vcsim's certificate (the lab's CA signed it)")
    parser.add_argument("--tls-key", type=Path, required=True)
    parser.add_argument("--watch-clones", action="store_true", help="print a CLONE line per power change")
    args = parser.parse_args(argv)

    vcsim, host, port = start_vcsim(args.vcsim, args.user, args.password_file, (args.tls_cert, args.tls_key))
    # The harness's own set-up connection: unverified, as in play_installer.
    si = vs.connect(host, args.user, args.password_file.read_text().strip(), port=port, insecure=True)
    vs.find_datacenter(si, "DC0").vmFolder.CreateFolder(args.folder)
    vs.disconnect(si)

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(args.iso_dir))
    handler.log_message = lambda *_: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    stop = threading.Event()
    threading.Thread(target=play_installer, args=(host, port, args.user, args.password_file, stop), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(
        "BOX " + json.dumps({"vcsim": f"{host}:{port}", "iso_url": f"http://127.0.0.1:{server.server_address[1]}"}),
        flush=True,
    )
    if args.watch_clones:
        threading.Thread(
            target=watch_clones, args=(host, port, args.user, args.password_file, stop), daemon=True
        ).start()
    stop.wait()
    server.shutdown()
    vcsim.terminate()
    vcsim.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
