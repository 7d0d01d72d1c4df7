"""Layer 3: HAProxy + Keepalived on the two balancers, the lab's only way to the API (VIP:6443)."""

from __future__ import annotations

import pulumi
import pulumi_random as random
from pulumi_command import remote

from components import remote as steps
from components.config import LabConfig
from components.rendering import lb as lb_rendering

# Keepalived's PASS authentication uses only the first 8 characters.
VRRP_PASSWORD_LENGTH = 8


class LoadBalancerPair(pulumi.ComponentResource):
    """One setup step per balancer; the pair is ready when both are."""

    setups: dict[str, remote.Command]

    def __init__(
        self,
        name: str,
        lab: LabConfig,
        ready: dict[str, pulumi.Resource],
        private_key: pulumi.Input[str],
        pins: steps.HostPins,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("labs-k8s:lb:LoadBalancerPair", name, None, opts)
        # Generated once per stack and kept in state as a secret.
        self.vrrp_password = random.RandomPassword(
            "vrrp-password",
            length=VRRP_PASSWORD_LENGTH,
            special=False,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.setups = {}
        remote_steps = steps.RemoteSteps(lab, private_key, self, pins)
        for balancer in lab.balancers:
            self.setups[balancer.name] = remote_steps.on_node(
                f"{balancer.name}-lb-setup",
                balancer,
                steps.Script(
                    lambda password, balancer=balancer: lb_rendering.balancer_files(lab, balancer, password),
                    lb_rendering.SETUP_SCRIPT,
                    secrets=[self.vrrp_password.result],
                ),
                after=[ready[balancer.name]],
            )
        self.endpoint = f"https://{lab.load_balancer.vip}:6443"
        self.register_outputs({"endpoint": self.endpoint})
