"""Layer 1: the golden Debian 12 template, built, sealed, converted and verified inside `pulumi up`.

The vSphere provider cannot mark a VM as a template (terraform-provider-vsphere #1180), and
converting a VM the provider manages breaks its state (#2177). So the template is a Pulumi
dynamic resource whose provider drives pyvmomi (components/vsphere/): remastered installer
ISO -> builder VM with the exact hardware -> unattended install and seal -> power-off ->
MarkAsTemplate -> hardware verified. docs/template.md explains the choice.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    ConfigureRequest,
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    ResourceProvider,
    UpdateResult,
)

from components.config import LabConfig
from components.rendering import template as template_rendering

log = logging.getLogger(__name__)

# Inputs whose change means a different template. All of them also enter the template's name
# (rendering.template.template_identity), so a replacement never finds the old template by name.
REPLACE_KEYS = ("name", "datacenter", "cluster", "datastore", "network", "folder", "resourcePool", "firmware")
# What the provider computes; never compared as inputs. uuid and guestId must be in the state:
# a state from before they existed is brought up to date by an in-place update.
COMPUTED_KEYS = ("uuid", "moid", "guestId", "isoPath")
REQUIRED_OUTPUTS = ("uuid", "guestId")
PROVIDER_KEY = "__provider"  # the pickled provider the SDK adds to every dynamic resource's inputs
# Per machine, outside any checkout: survives a fresh clone, shared by every stack on the machine.
CACHE_ROOT = Path(os.environ.get("LABS_K8S_CACHE", Path.home() / ".cache" / "labs-k8s"))
ISO_CACHE = CACHE_ROOT / "iso"
ISO_DATASTORE_DIR = "labs-k8s-iso"
# What a build may take beyond labs-k8s:template.buildTimeoutMinutes (the unattended install): the
# netinst download, remastering, the upload, the builder VM's eager-zeroed disk, the conversion.
# Pulumi's Python dynamic-provider host ignores the create timeout (pulumi 3.272 sdk/python/lib/
# pulumi/dynamic/__main__.py `Create` never reads request.timeout), so `create` enforces it itself.
BUILD_OVERHEAD_MINUTES = 30

# Input key of each required field (the camelCase names the program registers).
_REQUIRED_INPUTS = {
    "name": "name", "stack": "stack", "datacenter": "datacenter", "cluster": "cluster",
    "datastore": "datastore", "network": "network", "folder": "folder", "firmware": "firmware",
    "vcpu": "vcpu", "memory_mib": "memoryMib", "disk_gib": "diskGib", "build_timeout_s": "buildTimeoutSeconds",
    "iso_url": "isoUrl", "iso_sha256": "isoSha256", "iso_files": "isoFiles", "iso_name": "isoName",
}  # fmt: skip


def iso_datastore_path(stack: str, template_name: str) -> str:
    """Where a template's install ISO goes on the datastore: one directory per stack."""
    return f"{ISO_DATASTORE_DIR}/{stack}/{template_name}.iso"


class TemplateBuildError(RuntimeError):
    """The template could not be built or taken over; the message says what to do."""

    rebuild_helps = True  # False: the next `up` would build the same again and fail the same way


class DatastoreUnfitError(TemplateBuildError):
    """The datastore did not give the disks the provisioning asked for: only another datastore helps."""

    rebuild_helps = False


@dataclass(frozen=True)
class TemplateInputs:
    """The provider's inputs as they arrive in the dynamic-provider host.

    The SDK serializes them with pulumi.runtime.rpc.serialize_properties, which drops every None:
    an unset optional input (labs-k8s:vsphere.resourcePool) is absent, not None. Numbers arrive as
    floats. Everything reads the inputs through here, never as props[...] directly.
    """

    name: str
    stack: str
    datacenter: str
    cluster: str
    datastore: str
    network: str
    folder: str
    firmware: str
    vcpu: int
    memory_mib: int
    disk_gib: int
    build_timeout_s: float
    iso_url: str
    iso_sha256: str
    iso_files: Mapping[str, str]
    iso_name: str
    resource_pool: str | None = None  # optional: the cluster's root pool

    @staticmethod
    def missing(props: Mapping[str, Any]) -> list[str]:
        return [key for key in _REQUIRED_INPUTS.values() if props.get(key) in (None, "")]

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> TemplateInputs:
        missing = cls.missing(props)
        if missing:
            raise TemplateBuildError(
                f"the golden template's inputs lack {', '.join(missing)}: a bug in components/template.py"
            )
        values = {field_name: props[key] for field_name, key in _REQUIRED_INPUTS.items()}
        return cls(
            **{
                **values,
                "vcpu": int(values["vcpu"]),
                "memory_mib": int(values["memory_mib"]),
                "disk_gib": int(values["disk_gib"]),
                "build_timeout_s": float(values["build_timeout_s"]),
            },
            resource_pool=props.get("resourcePool") or None,
        )


@dataclass(frozen=True)
class VcenterLogin:
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    insecure: bool = False

    def session(self) -> Any:
        from components import vsphere

        return vsphere.session(self.host, self.user, self.password, port=self.port, insecure=self.insecure)


def report_progress(spec: TemplateInputs, message: str) -> None:
    """One phase of the build, shown by the CLI as it happens.

    Inside Pulumi's dynamic-provider host the SDK has no engine connection: the host configures
    its Settings without one (pulumi 3.272 sdk/python/lib/pulumi/dynamic/__main__.py get_provider),
    so pulumi.log.info, with or without a resource, prints "info: <message>" on the host's stderr
    (lib/pulumi/log.py info). The engine reads a provider plugin's stderr line by line and shows
    each line as an info diagnostic (sdk/go/common/resource/plugin/plugin.go newPlugin runtrace),
    without a resource: the CLI puts it on the stack's row (pkg/backend/display/progress.go
    processNormalEvent), so the line carries the template's name."""
    pulumi.log.info(f"golden template {spec.name}: {message}")


# State contract: every deployed stack's state pickles this class by its qualified name
# `components.template.TemplateBuildProvider`, and the dynamic-provider host unpickles it for every
# diff, refresh and destroy (pulumi/dynamic/__main__.py get_provider). Never rename or move it; if
# a layout change must, keep an importable alias here (tests/test_state_contract.py pins it).
class TemplateBuildProvider(ResourceProvider):
    """Runs in Pulumi's dynamic-provider process; every vCenter call goes through components.vsphere.

    The vCenter login is not an input of the resource: it is read when a call is made, from the
    stack configuration the engine hands this provider at Configure (for dynamic providers the
    engine passes every key, `vsphere:*` included: pulumi/pulumi#17673, Pulumi CLI 3.139.0 or newer)
    or from VSPHERE_* in the environment. So the password is never in this resource's state, a
    rotated password is used by the next `up` or preview, and a preview run with another
    (read-only) account shows no change. `refresh` and `destroy` do not run the program: every
    CLI configures them with the provider inputs recorded at the last `up`
    (pkg/resource/deploy/providers/registry.go Registry.Same; pulumi/pulumi#18740, which used the
    current config, was reverted by #18756), so a rotated password needs one `up` first: `make
    destroy` says so (components/tools/first_run.py, docs/runbook.md).
    """

    def configure(self, req: ConfigureRequest) -> None:
        from components.stack_config import vsphere_settings

        self._configured = vsphere_settings(req.config.get)

    def _login(self, props: Mapping[str, Any]) -> VcenterLogin:
        from components import vsphere
        from components.stack_config import provider_bool

        current: Mapping[str, str | None] = getattr(self, "_configured", None) or {}
        # A state written when the login was an input still carries it: the fallback for a CLI
        # that configures dynamic providers without the stack config.
        server = current.get("vsphereServer") or props.get("server")
        user = current.get("user") or props.get("user")
        password = current.get("password") or props.get("password")
        if not (server and user and password):
            raise TemplateBuildError(
                "no vCenter login for the golden template: set vsphere:vsphereServer, vsphere:user and "
                "vsphere:password in the stack config, or VSPHERE_SERVER, VSPHERE_USER and VSPHERE_PASSWORD in "
                "the environment (a Pulumi CLI older than 3.139.0 passes only the environment to this provider)"
            )
        raw_insecure = current.get("allowUnverifiedSsl")
        try:
            insecure = provider_bool(raw_insecure, default=bool(props.get("allowUnverifiedSsl", False)))
        except ValueError as error:
            raise TemplateBuildError(f"vsphere:allowUnverifiedSsl (or VSPHERE_ALLOW_UNVERIFIED_SSL): {error}") from None
        address = vsphere.parse_server(str(server))
        return VcenterLogin(
            host=address.host, port=address.port, user=str(user), password=str(password), insecure=insecure
        )

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        # Runs in previews too: a missing input fails there, not an hour into a build.
        return CheckResult(news, [CheckFailure(key, "required, but missing") for key in TemplateInputs.missing(news)])

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # olds are the recorded outputs: the inputs echoed, plus what the provider computed.
        keys = (set(news) | set(olds)) - set(COMPUTED_KEYS) - {PROVIDER_KEY}
        changed = sorted(key for key in keys if olds.get(key) != news.get(key))
        replaces = [key for key in REPLACE_KEYS if key in changed]
        # Everything else (the build VM's size and timeout) changes nothing in the built template:
        # an in-place update records it. So does a state lacking newer outputs, or one still
        # carrying the vCenter login (older states did): the update drops it from the state.
        stale = [key for key in REQUIRED_OUTPUTS if key not in olds]
        return DiffResult(changes=bool(changed or stale), replaces=replaces, delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        """The build, bounded: past buildTimeoutMinutes + BUILD_OVERHEAD_MINUTES the create fails,
        whatever phase hangs (a download that trickles, an upload to a datastore that stalls, a vCenter
        task that never ends). The build runs in a worker thread; the deployment gets the error, and a
        builder VM left behind is what the next `up` deletes (`_take_over`)."""
        import threading

        spec = TemplateInputs.from_props(props)
        limit_s = spec.build_timeout_s + BUILD_OVERHEAD_MINUTES * 60
        outcome: dict[str, Any] = {}

        def build() -> None:
            try:
                outcome["result"] = self._create(props)
            except Exception as error:  # re-raised in the caller's thread, as if raised there
                outcome["error"] = error

        worker = threading.Thread(target=build, name=f"template-build-{spec.name}", daemon=True)
        worker.start()
        worker.join(limit_s)
        if worker.is_alive():
            raise TemplateBuildError(
                f"building the golden template {spec.name} did not finish within {limit_s / 60:g} minutes "
                f"(labs-k8s:template.buildTimeoutMinutes {spec.build_timeout_s / 60:g} for the install, plus "
                f"{BUILD_OVERHEAD_MINUTES} for the media, the upload and the conversion): stopped waiting. A builder "
                "VM it made stays in vCenter; the next `pulumi up` deletes it and builds the template again"
            )
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def _create(self, props: dict[str, Any]) -> CreateResult:
        from components import vsphere

        spec = TemplateInputs.from_props(props)
        with self._login(props).session() as si:
            dc = vsphere.find_datacenter(si, spec.datacenter)
            existing = vsphere.find_vm(si, spec.name, dc)
            if existing is not None and self._take_over(si, existing, spec):
                return self._created(si, existing, props, None)
            iso_path = self._upload_media(si, spec)
            report_progress(spec, f"creating the builder VM {spec.name} (eager-zeroed {spec.disk_gib} GiB disk)")
            builder = vsphere.create_builder_vm(si, self._builder_spec(spec, iso_path))
            try:
                vsphere.power_on(builder.vm)
                started = time.monotonic()
                report_progress(
                    spec,
                    f"the unattended Debian install is running on the builder VM {spec.name} "
                    f"({vsphere.inventory_path(si, builder.vm)}); watch it in the vSphere Client: that VM, "
                    f"Launch Web Console. It powers itself off when done (at most "
                    f"{spec.build_timeout_s / 60:g} min, labs-k8s:template.buildTimeoutMinutes)",
                )
                # The preseed ends with a power-off once the seal script has run in the target.
                vsphere.wait_for_power_off(builder.vm, timeout_s=spec.build_timeout_s)
                report_progress(
                    spec,
                    f"installed and sealed in {(time.monotonic() - started) / 60:.1f} min (the seal script ran, "
                    "the VM powered off): detaching the installer ISO",
                )
                vsphere.detach_iso(builder.vm, remove_device=True)
                report_progress(spec, "verifying the hardware (PVSCSI, VMXNET3, eager-zeroed disk)")
                self._verify(builder.vm, spec.name, spec.datastore)
                vsphere.mark_as_template(builder.vm)
                report_progress(spec, "verified and marked as a template")
            except Exception as error:
                raise TemplateBuildError(self._keep_for_inspection(si, builder.vm, spec, error)) from error
            return self._created(si, builder.vm, props, iso_path)

    def _take_over(self, si: Any, vm: Any, spec: TemplateInputs) -> bool:
        """A VM already has the template's name. True: it is our finished template, adopted.
        False: it was our leftover builder VM, now deleted. Anything not ours is an error."""
        from components import vsphere

        owner = vsphere.vm_stack(vm)
        path = vsphere.inventory_path(si, vm)
        if owner != spec.stack:
            whose = f"stack {owner!r}" if owner else "no labs-k8s stack (it has no stack tag)"
            raise TemplateBuildError(
                f"vCenter already has a VM named {spec.name!r} ({path}) that belongs to {whose}, not to stack "
                f"{spec.stack!r}: labs-k8s never adopts, rebuilds over or deletes a VM it did not tag. Rename or "
                "remove that VM, or choose another labs-k8s:template.name"
            )
        if vm.config.template:
            # A previous `up` built it but did not record it (interrupted): adopt it after checking.
            report_progress(spec, f"adopting the finished template {path} of an interrupted `up`: verifying it")
            self._verify(vm, spec.name, spec.datastore)
            return True
        # A builder VM of ours: from an interrupted build, or kept after a failed install for
        # inspection. This run starts over from a clean slate.
        log.warning("deleting the builder VM %s left by an earlier build of stack %s", path, spec.stack)
        vsphere.destroy_vm(vm)
        return False

    @staticmethod
    def _upload_media(si: Any, spec: TemplateInputs) -> str:
        from components import iso, vsphere

        def progress(message: str) -> None:
            report_progress(spec, message)

        media = iso.build_install_media(
            spec.iso_url, spec.iso_sha256, spec.iso_files, spec.iso_name, ISO_CACHE, progress=progress
        )
        remote = iso_datastore_path(spec.stack, spec.name)
        size = media.stat().st_size
        progress(f"uploading {media.name} ({size / iso.MIB:.0f} MiB) to [{spec.datastore}] {remote}")
        started = time.monotonic()
        uploaded = str(vsphere.upload_to_datastore(si, spec.datacenter, spec.datastore, remote, media))
        progress(f"uploaded: {iso.mib_rate(size, time.monotonic() - started)}")
        return uploaded

    @staticmethod
    def _builder_spec(spec: TemplateInputs, iso_path: str) -> Any:
        from components import vsphere

        return vsphere.BuilderVmSpec(
            name=spec.name,
            datacenter=spec.datacenter,
            cluster=spec.cluster,
            datastore=spec.datastore,
            network=spec.network,
            iso_path=iso_path,
            folder=spec.folder,
            resource_pool=spec.resource_pool,
            num_cpus=spec.vcpu,
            memory_mib=spec.memory_mib,
            disk_gib=spec.disk_gib,
            # A plain str in the provider's inputs, which only TemplateConfig.firmware (bios or efi) sets.
            firmware=spec.firmware,  # type: ignore[arg-type]
            annotation=f"labs-k8s golden template {spec.name}; built by Pulumi stack {spec.stack}",
            extra_config=vsphere.stack_tag(spec.stack),
        )

    @staticmethod
    def _keep_for_inspection(si: Any, vm: Any, spec: TemplateInputs, error: Exception) -> str:
        """The failed builder stays (powered off): deleting it would delete the evidence."""
        from components import vsphere

        path = vsphere.inventory_path(si, vm)
        try:
            vsphere.power_off(vm)
            state = "kept, powered off, for inspection"
        except vsphere.VSphereError as power_error:
            state = f"kept for inspection (powering it off failed too: {power_error})"
        if not getattr(error, "rebuild_helps", True):
            # An hour-long build that cannot pass must not be promised again on every `up`.
            return (
                f"building the golden template {spec.name} failed: {error} The builder VM {path} is {state}; "
                "the next `pulumi up` deletes it."
            )
        return (
            f"building the golden template {spec.name} failed: {error}. The builder VM {path} is {state}: "
            "power it on and open its console to see where the installer stops. The next `pulumi up` "
            "deletes it and builds the template again."
        )

    @staticmethod
    def _verify(vm: Any, name: str, datastore: str) -> None:
        from components import vsphere

        problems = vsphere.verify_template_hardware(vm)
        if not problems:
            return
        found = f"template {name} does not have the hardware the lab needs: " + "; ".join(problems) + "."
        if any(problem.datastore_bound for problem in problems):
            # CreateVM asked for eager-zeroed thick; the datastore decided otherwise.
            raise DatastoreUnfitError(
                f"{found} Datastore {datastore!r} did not provision the disk as eager-zeroed thick (an NFS "
                "datastore without hardware acceleration offers only thin disks, vSAN follows its storage "
                "policy), so building again on it ends the same. Set labs-k8s:vsphere.datastore to a VMFS "
                "datastore, or an NFS one with hardware acceleration on every host (docs/template.md, "
                '"Storage"), then run `pulumi up`.'
            )
        raise TemplateBuildError(f"{found} Delete it in vCenter and run `pulumi up` again.")

    def _created(self, si: Any, vm: Any, props: Mapping[str, Any], iso_path: str | None) -> CreateResult:
        spec = TemplateInputs.from_props(props)
        # The template no longer needs its install ISO (~700 MB): remove it now.
        self._remove_media(si, spec.datacenter, spec.stack, iso_path or self._iso_on(spec))
        # Recorded even when removed: destroy deletes it again if it is still (or again) there.
        outputs = self._outputs(vm, props, iso_path or self._iso_on(spec))
        return CreateResult(id_=outputs["uuid"], outs=outputs)

    @staticmethod
    def _iso_on(spec: TemplateInputs) -> str:
        return f"[{spec.datastore}] {iso_datastore_path(spec.stack, spec.name)}"

    @staticmethod
    def _remove_media(si: Any, datacenter: str, stack: str, iso_path: str | None) -> None:
        """Delete an uploaded ISO of this stack; another stack's directory is never touched."""
        from components import vsphere

        if not iso_path or f"] {ISO_DATASTORE_DIR}/{stack}/" not in iso_path:
            return
        try:
            vsphere.delete_datastore_file(si, datacenter, iso_path)
            # The stack's directory too, once no ISO of it is left (a build running at the same
            # time in this stack cannot be: the stack's state is locked), then labs-k8s-iso/
            # itself once no stack has one there (found on the real engine: destroy left it).
            # Another stack's upload could only begin in the moment between the listing and the
            # delete; its upload then fails and its retry makes the directory again.
            stack_dir = iso_path.rsplit("/", 1)[0]
            if vsphere.remove_empty_datastore_dir(si, datacenter, stack_dir):
                vsphere.remove_empty_datastore_dir(si, datacenter, stack_dir.rsplit("/", 1)[0])
        except vsphere.VSphereError as error:
            # The template is fine without it; destroy tries again.
            log.warning("could not delete the install ISO %s: %s", iso_path, error)

    @staticmethod
    def _outputs(vm: Any, props: Mapping[str, Any], iso_path: str | None) -> dict[str, Any]:
        from components import vsphere

        outputs = {key: value for key, value in props.items() if key not in COMPUTED_KEYS}
        outputs.update(uuid=vsphere.template_uuid(vm), moid=vm._moId, guestId=str(vm.config.guestId))
        if iso_path:
            outputs["isoPath"] = iso_path
        return outputs

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from components import vsphere

        spec = TemplateInputs.from_props(news)
        with self._login(news).session() as si:
            vm = self._ours(si, id_, spec.stack)
            if vm is None:
                raise TemplateBuildError(
                    f"template {olds.get('name', id_)} (uuid {id_}) is no longer in vCenter as a template of stack "
                    f"{spec.stack!r}; run `pulumi refresh --stack {spec.stack}`, then `pulumi up` builds it again"
                )
            vsphere.mark_as_template(vm)  # no-op for a template; refuses a running VM
            return UpdateResult(outs=self._outputs(vm, news, olds.get("isoPath")))

    @staticmethod
    def _ours(si: Any, id_: str, stack: str | None) -> Any:
        """The template with this UUID if it carries this stack's tag, else None."""
        from components import vsphere

        vm = vsphere.find_vm_by_uuid(si, id_)
        if vm is None or vsphere.vm_stack(vm) != stack:
            return None
        return vm

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        with self._login(props).session() as si:
            vm = self._ours(si, id_, props.get("stack"))
            if vm is None:
                return ReadResult(id_="", outs={})
            return ReadResult(id_=id_, outs=self._outputs(vm, props, props.get("isoPath")))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from components import vsphere

        stack = props.get("stack")
        with self._login(props).session() as si:
            vm = vsphere.find_vm_by_uuid(si, id_)
            if vm is not None:
                if vsphere.vm_stack(vm) == stack:
                    vsphere.destroy_vm(vm)
                else:
                    log.warning(
                        "not deleting %s (uuid %s): it does not carry stack %r's tag",
                        vsphere.inventory_path(si, vm),
                        id_,
                        stack,
                    )
            if stack and props.get("datacenter"):
                self._remove_media(si, str(props["datacenter"]), str(stack), props.get("isoPath"))


class TemplateBuild(Resource):
    uuid: pulumi.Output[str]
    moid: pulumi.Output[str]
    guestId: pulumi.Output[str]
    isoPath: pulumi.Output[str]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        outputs = dict.fromkeys(COMPUTED_KEYS)
        super().__init__(TemplateBuildProvider(), name, {**props, **outputs}, opts)


class GoldenTemplate(pulumi.ComponentResource):
    """The template every node is cloned from. Its UUID is a stack output."""

    def __init__(
        self,
        name: str,
        lab: LabConfig,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("labs-k8s:template:GoldenTemplate", name, None, opts)
        stack = pulumi.get_stack()
        # The name carries the template's identity: content, placement, firmware and stack.
        self.name = template_rendering.template_vm_name(lab, stack)
        placement = lab.vsphere
        build = TemplateBuild(
            "golden-template",
            {
                "name": self.name,
                "version": template_rendering.template_version(lab),
                "stack": stack,
                "datacenter": placement.datacenter,
                "cluster": placement.compute_cluster,
                "datastore": placement.datastore,
                "network": placement.network,
                "folder": placement.folder,
                "resourcePool": placement.resource_pool,
                "firmware": lab.template.firmware,
                "scsiType": "pvscsi",
                "nicType": "vmxnet3",
                "diskGib": lab.template.disk_gib,
                "eagerlyScrub": True,
                "thinProvisioned": False,
                "vcpu": lab.template.vcpu,
                "memoryMib": lab.template.memory_mib,
                "buildTimeoutSeconds": lab.template.build_timeout_minutes * 60,
                # Exactly what goes on the install ISO, so a preview shows it (and nothing about nodes).
                "isoUrl": lab.template.iso_url,
                "isoSha256": lab.template.iso_sha256,
                "isoFiles": template_rendering.iso_files(lab),
                "isoName": template_rendering.remastered_iso_name(lab),
                # No vCenter login here: the provider reads it from the stack config at each call.
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                # Kept across lab rebuilds when the config says so (labs-k8s:template.retainOnDestroy).
                retain_on_delete=lab.template.retain_on_destroy,
                # Enforced by the provider itself (create): the Python dynamic-provider host ignores it.
                custom_timeouts=pulumi.CustomTimeouts(
                    create=f"{lab.template.build_timeout_minutes + BUILD_OVERHEAD_MINUTES}m"
                ),
            ),
        )
        self.uuid = build.uuid
        # What the builder actually used: debian12_64Guest, or an older id on older vSphere. The
        # clones must say the same, or vCenter refuses them.
        self.guest_id = build.guestId
        self.register_outputs({"uuid": self.uuid, "name": self.name, "guestId": self.guest_id})
