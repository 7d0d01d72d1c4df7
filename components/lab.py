"""The whole lab as one component: template -> fleet -> load balancers -> kubeadm cluster.

Each layer is a ComponentResource of its own; data flow (the template's UUID into the clones,
readiness steps into the remote steps) orders most of the graph, and explicit dependencies
are used only where it does not.
"""

from __future__ import annotations

import pulumi

from components.cluster import KubeadmCluster
from components.fleet import NodeFleet
from components.loadbalancer import LoadBalancerPair
from components.previous_state import PreviousState
from components.stack_config import StackInputs
from components.template import GoldenTemplate


class Lab(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        inputs: StackInputs,
        previous: PreviousState | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("labs-k8s:lab:Lab", name, None, opts)
        lab = inputs.lab
        child = pulumi.ResourceOptions(parent=self)
        self.template = GoldenTemplate("template", lab, opts=child)
        self.fleet = NodeFleet(
            "fleet", lab, self.template.uuid, self.template.guest_id, inputs.ssh_private_key, previous, opts=child
        )
        self.balancers = LoadBalancerPair(
            "balancers",
            lab,
            {node.name: self.fleet.ready[node.name] for node in lab.balancers},
            inputs.ssh_private_key,
            self.fleet.pins,
            opts=child,
        )
        self.cluster = KubeadmCluster(
            "cluster",
            lab,
            self.fleet.vms,
            {node.name: self.fleet.ready[node.name] for node in lab.kubernetes_nodes},
            list(self.balancers.setups.values()),
            inputs.ssh_private_key,
            self.fleet.pins,
            previous,
            opts=child,
        )
        self.api_endpoint = self.balancers.endpoint
        self.known_hosts = self.fleet.known_hosts
        self.node_table = [{"name": node.name, "role": node.role.value, "ip": str(node.ip)} for node in lab.all_nodes]
        self.register_outputs({"apiEndpoint": self.api_endpoint})
