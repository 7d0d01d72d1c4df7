"""`python -m components targets --stack STACK LAYER`: the `--target` URNs of one part of the program.

`make up LAYER=vsphere` and `make preview LAYER=vsphere` hand these to the Pulumi CLI, one
`--target=URN` each: the vSphere half alone (the golden template, the clones and the DRS rules,
none of the remote steps over SSH), e.g. a first run against a new vCenter before the nodes are
reachable; `LAYER=template` is the golden template alone. The URNs hold `$` and `*`, which make and
the shell would expand in `ARGS='--target ...'`: the Makefile reads this command's lines into a
bash array and passes them quoted. tests/test_real_engine.py runs the same list on the real engine.
"""

from __future__ import annotations

import sys

from components.tools.offline import PROJECT

# Every resource of a layer, as `--target` globs: the engine matches `*` within a URN segment and
# `**` across them (pkg/resource/deploy/target.go). A target list must hold the parents too: the
# `Lab` component, then the template and fleet components, then their children.
_LAB = "urn:pulumi:{stack}::{project}::labs-k8s:lab:Lab"
_TEMPLATE = (
    f"{_LAB}::labs-k8s",
    f"{_LAB}$labs-k8s:template:GoldenTemplate::template",
    f"{_LAB}$labs-k8s:template:GoldenTemplate$**",
)
LAYERS: dict[str, tuple[str, ...]] = {
    # The golden template: its component and our dynamic provider's resource.
    "template": _TEMPLATE,
    # Everything that talks to vCenter: the template, the fleet's VMs and DRS rules, the clone
    # sources (our dynamic provider), and the nodes' keys the VMs' user-data is made from.
    "vsphere": (
        *_TEMPLATE,
        f"{_LAB}$labs-k8s:fleet:NodeFleet::fleet",
        f"{_LAB}$labs-k8s:fleet:NodeFleet$vsphere:**",
        f"{_LAB}$labs-k8s:fleet:NodeFleet$pulumi-python:dynamic:**",
        f"{_LAB}$labs-k8s:fleet:NodeFleet$random:**",
    ),
}


class UnknownLayerError(ValueError):
    pass


def layer_targets(stack: str, layer: str) -> list[str]:
    """The `--target` URN globs of `layer` in `stack`; an unknown layer names the choices."""
    if layer not in LAYERS:
        raise UnknownLayerError(
            f"LAYER={layer!r} is not a layer of this program; LAYER is one of: {', '.join(sorted(LAYERS))} "
            "(or leave it unset for the whole lab)"
        )
    return [urn.format(stack=stack, project=PROJECT) for urn in LAYERS[layer]]


def cli(stack: str, layer: str) -> int:
    try:
        urns = layer_targets(stack, layer)
    except UnknownLayerError as error:
        print(error, file=sys.stderr)
        return 2
    print("\n".join(urns))
    return 0
