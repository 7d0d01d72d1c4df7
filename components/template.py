"""Layer 1: the golden Debian 12 template, built, sealed, converted and verified inside `pulumi up`.

The vSphere provider cannot mark a VM as a template (terraform-provider-vsphere #1180), and
converting a VM the provider manages breaks its state (#2177). So the template is a Pulumi
dynamic resource whose provider drives pyvmomi (components/vsphere/): remastered installer
ISO -> builder VM with the exact hardware -> unattended install and seal -> power-off ->
MarkAsTemplate -> hardware verified. docs/template.md explains the choice.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CheckFailure, CheckResult, CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from components.config import LabConfig
from components.rendering import template as template_rendering
from components.stack_config import VcenterCredentials

# Inputs whose change means a different template. The name carries the content hash of the
# template's own inputs (ISO, preseed, seal script, boot menus, disk size), so node changes
# never rebuild it.
REPLACE_KEYS = ("name", "datacenter", "cluster", "datastore", "network", "folder", "resourcePool", "firmware")
ISO_CACHE = Path(os.environ.get("LABS_K8S_CACHE", Path.home() / ".cache" / "labs-k8s")) / "iso"
ISO_DATASTORE_DIR = "labs-k8s-iso"


# Input key of each required field (the camelCase names the program registers).
_REQUIRED_INPUTS = {
    "name": "name", "stack": "stack", "datacenter": "datacenter", "cluster": "cluster",
    "datastore": "datastore", "network": "network", "folder": "folder", "firmware": "firmware",
    "vcpu": "vcpu", "memory_mib": "memoryMib", "disk_gib": "diskGib", "build_timeout_s": "buildTimeoutSeconds",
    "iso_url": "isoUrl", "iso_sha256": "isoSha256", "iso_files": "isoFiles",
}  # fmt: skip


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
    resource_pool: str | None = None  # optional: the cluster's root pool

    @staticmethod
    def missing(props: Mapping[str, Any]) -> list[str]:
        return [key for key in _REQUIRED_INPUTS.values() if props.get(key) in (None, "")]

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> TemplateInputs:
        missing = cls.missing(props)
        if missing:
            raise ValueError(f"the golden template's inputs lack {', '.join(missing)}: a bug in components/template.py")
        values = {field_name: props[key] for field_name, key in _REQUIRED_INPUTS.items()}
        return cls(
            **{**values, "vcpu": int(values["vcpu"]), "memory_mib": int(values["memory_mib"]),
               "disk_gib": int(values["disk_gib"]), "build_timeout_s": float(values["build_timeout_s"])},
            resource_pool=props.get("resourcePool") or None,
        )


class TemplateBuildProvider(ResourceProvider):
    """Runs in Pulumi's dynamic-provider process; every vCenter call goes through components.vsphere."""

    def _session(self, props: Mapping[str, Any]) -> Any:
        from components import vsphere

        host, _, port = str(props["server"]).partition(":")
        return vsphere.session(
            host, props["user"], props["password"], port=int(port or 443),
            insecure=bool(props.get("allowUnverifiedSsl", False)),
        )

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        # Runs in previews too: a missing input fails there, not an hour into a build.
        missing = TemplateInputs.missing(news) + [
            key for key in ("server", "user", "password") if news.get(key) in (None, "")
        ]
        return CheckResult(news, [CheckFailure(key, "required, but missing") for key in missing])

    def create(self, props: dict[str, Any]) -> CreateResult:
        from components import iso, vsphere

        spec = TemplateInputs.from_props(props)
        name = spec.name
        with self._session(props) as si:
            existing = vsphere.find_vm(si, name)
            if existing is not None and existing.config.template:
                # A previous `up` built it but did not record it (interrupted): adopt it after checking.
                self._verify(vsphere, existing, name)
                return self._result(vsphere, existing, props)
            if existing is not None:
                # A builder VM left by an interrupted build: start over from a clean slate.
                vsphere.destroy_vm(existing)
            media = iso.build_install_media(spec.iso_url, spec.iso_sha256, spec.iso_files, f"{name}.iso", ISO_CACHE)
            iso_path = vsphere.upload_to_datastore(
                si, spec.datacenter, spec.datastore, f"{ISO_DATASTORE_DIR}/{media.name}", media
            )
            builder_spec = vsphere.BuilderVmSpec(
                name=name,
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
                firmware=spec.firmware,  # type: ignore[arg-type]
                annotation=f"labs-k8s golden template {name}; built by Pulumi stack {spec.stack}",
                extra_config=vsphere.stack_tag(spec.stack),
            )
            builder = vsphere.create_builder_vm(si, builder_spec)
            try:
                vsphere.power_on(builder.vm)
                # The preseed ends with a power-off once the seal script has run in the target.
                vsphere.wait_for_power_off(builder.vm, timeout_s=spec.build_timeout_s)
                vsphere.detach_iso(builder.vm, remove_device=True)
                vsphere.mark_as_template(builder.vm)
                self._verify(vsphere, builder.vm, name)
            except Exception:
                vsphere.destroy_vm(builder.vm)
                raise
            return self._result(vsphere, builder.vm, props)

    @staticmethod
    def _verify(vsphere: Any, vm: Any, name: str) -> None:
        problems = vsphere.verify_template_hardware(vm)
        if problems:
            raise RuntimeError(
                f"template {name} does not have the hardware the lab needs: " + "; ".join(problems)
                + ". Delete it in vCenter and run `pulumi up` again."
            )

    @staticmethod
    def _result(vsphere: Any, vm: Any, props: dict[str, Any]) -> CreateResult:
        uuid = vsphere.template_uuid(vm)
        return CreateResult(id_=uuid, outs={**props, "uuid": uuid, "moid": vm._moId})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [key for key in REPLACE_KEYS if olds.get(key) != news.get(key)]
        # Credentials and the node part of the lab config change nothing about a built template.
        return DiffResult(changes=bool(replaces), replaces=replaces, delete_before_replace=False)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from components import vsphere

        with self._session(props) as si:
            vm = vsphere.find_vm_by_uuid(si, id_)
            if vm is None:
                return ReadResult(id_="", outs={})
            return ReadResult(id_=id_, outs={**props, "uuid": id_, "moid": vm._moId})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from components import vsphere

        with self._session(props) as si:
            vm = vsphere.find_vm_by_uuid(si, id_)
            if vm is not None:
                vsphere.destroy_vm(vm)


class TemplateBuild(Resource):
    uuid: pulumi.Output[str]
    moid: pulumi.Output[str]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TemplateBuildProvider(), name, {**props, "uuid": None, "moid": None}, opts)


class GoldenTemplate(pulumi.ComponentResource):
    """The template every node is cloned from. Its UUID is a stack output."""

    def __init__(
        self,
        name: str,
        lab: LabConfig,
        vcenter: VcenterCredentials,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("labs-k8s:template:GoldenTemplate", name, None, opts)
        self.name = template_rendering.template_vm_name(lab)
        placement = lab.vsphere
        build = TemplateBuild(
            "golden-template",
            {
                "name": self.name,
                "version": template_rendering.template_version(lab),
                "stack": pulumi.get_stack(),
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
                "server": vcenter.server,
                "user": vcenter.user,
                "password": pulumi.Output.secret(vcenter.password),
                "allowUnverifiedSsl": vcenter.allow_unverified_ssl,
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                # Kept across lab rebuilds when the config says so (labs-k8s:template.retainOnDestroy).
                retain_on_delete=lab.template.retain_on_destroy,
                # The provider echoes its inputs as outputs: keep the password secret there too.
                additional_secret_outputs=["password"],
                custom_timeouts=pulumi.CustomTimeouts(create=f"{lab.template.build_timeout_minutes + 30}m"),
            ),
        )
        self.uuid = build.uuid
        self.register_outputs({"uuid": self.uuid, "name": self.name})
