"""Which template a node is cloned from: the template of when the node was created.

A VM's `clone.template_uuid` is ForceNew in terraform-provider-vsphere, so passing the current
template's UUID straight to the VM would replace every node whenever the template is rebuilt
(a new Debian point release, an edited preseed, new NTP servers). `ignore_changes=["clone"]`
stops that, but the engine then uses the *old* value for a replacement too
(step_generator.go processIgnoreChanges): a node replaced after a rebuild would be cloned from
a template that was deleted with the rebuild, and with delete-before-replace the old node is
already gone when that clone fails.

`CloneSource` keeps the template of the node's creation and moves to the current one only when
the node gets a new VM anyway: its `diff()` replaces it when the node's identity (cloud-init
instance-id) changes and ignores a template change otherwise. The VM takes the template UUID
from it, and its `replace_trigger` from its id, so:

- template rebuilt, node unchanged: nothing happens to the node;
- node identity changed: a new CloneSource with the current template, and a new VM cloned
  from it;
- `pulumi up --replace <the node's clone-source URN>`: the node is re-cloned from the current
  template (docs/runbook.md).

Pure: no vCenter call; it runs in Pulumi's dynamic-provider host like the template provider.
"""

from __future__ import annotations

import secrets
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider


# State contract: every deployed stack's state pickles this class by its qualified name
# `components.clone_source.CloneSourceProvider`, and the dynamic-provider host unpickles it for
# every diff, refresh and destroy (pulumi/dynamic/__main__.py get_provider). Never rename or move
# it; if a layout change must, keep an importable alias here (tests/test_state_contract.py pins it).
class CloneSourceProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        # A new id per creation: the VM's replace_trigger carries it.
        return CreateResult(
            id_=f"{props['node']}-{secrets.token_hex(4)}",
            outs={
                "node": props["node"],
                "identity": props["identity"],
                "template": props["template"],
                "guestId": props["guestId"],
            },
        )

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # `olds` are the outputs of the creation: the identity and template of that time.
        replaces = [key for key in ("node", "identity") if olds.get(key) != news.get(key)]
        return DiffResult(changes=bool(replaces), replaces=replaces, delete_before_replace=False)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_=id_, outs=props)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        """Nothing exists outside Pulumi's state."""


class CloneSource(Resource):
    """`template`: the UUID of the template to clone the node from, `guest_id` its guest id (the
    clone must name the same); `id` is new with every source."""

    template: pulumi.Output[str]
    identity: pulumi.Output[str]
    guestId: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        node: str,
        identity: str,
        template_uuid: pulumi.Input[str],
        template_guest_id: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(
            CloneSourceProvider(),
            name,
            {"node": node, "identity": identity, "template": template_uuid, "guestId": template_guest_id},
            opts,
        )

    @property
    def guest_id(self) -> pulumi.Output[str]:
        return self.guestId
