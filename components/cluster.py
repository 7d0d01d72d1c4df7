"""Layer 4: kubeadm on the prepared nodes: init, serialized control-plane joins, workers, Flannel, verify.

Order (each arrow is a dependency in the graph, not a registration order):
  node ready -> prepare (every node, in parallel)
  prepare m01 + both balancers -> init on m01
  init -> refresh join material for m02 -> join m02 -> refresh for m03 -> join m03
  init -> refresh for worker N -> join worker N   (workers in parallel)
  init -> Flannel;   every join + Flannel -> verify
A join never reads `kubeadm init` output: the CA hash comes from its own refresh step.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_random as random
from pulumi_command import remote

from components import remote as steps
from components.config import LabConfig, Node
from components.rendering import STEP_ROOT
from components.rendering import k8s as k8s_rendering

TEARDOWN_MARKER = "/var/lib/labs-k8s/teardown"


class KubeadmCluster(pulumi.ComponentResource):
    """The HA control plane behind the VIP, the workers, the CNI and a final verification."""

    def __init__(
        self,
        name: str,
        lab: LabConfig,
        ready: dict[str, pulumi.Resource],
        balancers_ready: Sequence[pulumi.Resource],
        private_key: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("labs-k8s:k8s:KubeadmCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self._lab = lab
        self._private_key = private_key

        # Generated once per stack, kept in state as secrets. Token: [a-z0-9]{6}.[a-z0-9]{16}.
        token_id = random.RandomPassword("bootstrap-token-id", length=6, special=False, upper=False, opts=child)
        token_secret = random.RandomPassword(
            "bootstrap-token-secret", length=16, special=False, upper=False, opts=child
        )
        self.token = pulumi.Output.secret(pulumi.Output.concat(token_id.result, ".", token_secret.result))
        certificate_key = random.RandomId(
            "certificate-key",
            byte_length=32,
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["hex", "b64Std", "b64Url", "dec"]),
        )
        self.certificate_key = pulumi.Output.secret(certificate_key.hex)

        first, *other_control_planes = lab.control_planes
        self.first_control_plane = first

        self.prepared: dict[str, remote.Command] = {
            node.name: self._step(
                f"{node.name}-prepare",
                node,
                files=lambda node=node: k8s_rendering.prepare_files(lab, node),
                entrypoint=k8s_rendering.PREPARE_ENTRYPOINT,
                depends_on=[ready[node.name]],
                timeout="40m",
            )
            for node in lab.kubernetes_nodes
        }

        self.init = self._step(
            f"{first.name}-kubeadm-init",
            first,
            files=lambda token, key: k8s_rendering.init_files(lab, token, key),
            entrypoint=k8s_rendering.INIT_ENTRYPOINT,
            secrets=[self.token, self.certificate_key],
            # The VIP must answer before init: controlPlaneEndpoint points there.
            depends_on=[self.prepared[first.name], *balancers_ready],
            handles_secrets=True,
        )

        # Control planes join one at a time: two joins at once race on etcd membership.
        self.joins: dict[str, remote.Command] = {}
        previous: remote.Command = self.init
        for node in other_control_planes:
            refresh = self._refresh_for(node, after=previous)
            previous = self._step(
                f"{node.name}-kubeadm-join",
                node,
                files=lambda token, key, node=node: k8s_rendering.control_plane_join_files(lab, node, token, key),
                entrypoint=k8s_rendering.CONTROL_PLANE_JOIN_ENTRYPOINT,
                secrets=[self.token, self.certificate_key],
                args=[refresh.stdout.apply(str.strip)],
                depends_on=[self.prepared[node.name], refresh],
                handles_secrets=True,
            )
            self.joins[node.name] = previous

        # Workers join in parallel, each with freshly refreshed join material.
        self.drains: list[remote.Command] = []
        for node in lab.workers:
            refresh = self._refresh_for(node, after=self.init)
            join = self._step(
                f"{node.name}-kubeadm-join",
                node,
                files=lambda token, node=node: k8s_rendering.worker_join_files(lab, node, token),
                entrypoint=k8s_rendering.WORKER_JOIN_ENTRYPOINT,
                secrets=[self.token],
                args=[refresh.stdout.apply(str.strip)],
                depends_on=[self.prepared[node.name], refresh],
                handles_secrets=True,
            )
            self.joins[node.name] = join
            self.drains.append(self._drain_on_removal(node, join))

        self.flannel = self._step(
            f"{first.name}-flannel",
            first,
            files=lambda: k8s_rendering.flannel_files(lab),
            entrypoint=k8s_rendering.FLANNEL_ENTRYPOINT,
            depends_on=[self.init],
        )

        self.verify = self._step(
            f"{first.name}-verify-cluster",
            first,
            files=lambda: k8s_rendering.verify_files(lab),
            entrypoint=k8s_rendering.VERIFY_ENTRYPOINT,
            depends_on=[*self.joins.values(), self.flannel],
            timeout="20m",
        )

        kubeconfig_step = self._step(
            f"{first.name}-kubeconfig",
            first,
            files=lambda: k8s_rendering.kubeconfig_files(lab),
            entrypoint=k8s_rendering.KUBECONFIG_ENTRYPOINT,
            depends_on=[self.init],
            handles_secrets=True,
        )
        self.kubeconfig = pulumi.Output.secret(kubeconfig_step.stdout)

        # Deleted first on `pulumi destroy` (it depends on every drain step), it leaves a marker
        # that makes the drain steps skip: a full teardown drains nothing and finishes.
        # Bounded like every step: a gone m01 fails the destroy within minutes (docs/troubleshooting.md).
        self.teardown_guard = steps.command(
            "teardown-guard",
            connection=steps.connection(lab, first, private_key),
            create=f"sudo -n rm -f {TEARDOWN_MARKER}",
            delete=f"sudo -n install -D -m 0644 /dev/null {TEARDOWN_MARKER}",
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[self.init, *self.drains],
                custom_timeouts=pulumi.CustomTimeouts(create="5m", update="5m", delete="5m"),
            ),
        )
        self.register_outputs({"kubeconfig": self.kubeconfig})

    def _step(
        self,
        resource_name: str,
        node: Node,
        *,
        files: object,
        entrypoint: str,
        depends_on: Sequence[pulumi.Resource],
        secrets: Sequence[pulumi.Input[str]] = (),
        args: Sequence[pulumi.Input[str]] = (),
        handles_secrets: bool = False,
        delete: str | None = None,
        timeout: str = "30m",
        rerun_on_change: bool = True,
    ) -> remote.Command:
        return steps.run_step(
            resource_name,
            lab=self._lab,
            node=node,
            private_key=self._private_key,
            files=files,  # type: ignore[arg-type]
            entrypoint=entrypoint,
            secrets=secrets,
            args=args,
            parent=self,
            depends_on=depends_on,
            handles_secrets=handles_secrets,
            delete=delete,
            timeout=timeout,
            rerun_on_change=rerun_on_change,
        )

    def _refresh_for(self, joining: Node, after: pulumi.Resource) -> remote.Command:
        """On the first control plane, right before `joining` joins: re-upload the control-plane
        certificates (they expire 2 h after upload) and make sure the token exists (24 h TTL).
        Prints the CA certificate hash, which the join takes as its discovery pin."""
        lab = self._lab
        return self._step(
            f"{joining.name}-refresh-join-material",
            self.first_control_plane,
            files=lambda token, key: k8s_rendering.refresh_files(lab, token, key),
            entrypoint=k8s_rendering.REFRESH_ENTRYPOINT,
            secrets=[self.token, self.certificate_key],
            depends_on=[after],
            handles_secrets=True,
        )

    def _drain_on_removal(self, worker: Node, join: remote.Command) -> remote.Command:
        """Installs the drain script on the first control plane; its delete drains `worker`.

        Removing a worker from the config deletes this step first (it depends on the join,
        which depends on the VM), so the node is drained and deleted before its VM goes.
        """
        lab = self._lab
        step = f"{worker.name}-drain-on-removal"
        script = f"{STEP_ROOT}/{step}/{k8s_rendering.DRAIN_ENTRYPOINT}"
        return self._step(
            step,
            self.first_control_plane,
            files=lambda: {**k8s_rendering.drain_files(lab, worker.name), "installed.sh": "true\n"},
            entrypoint="installed.sh",
            depends_on=[join],
            delete=f"sudo -n bash {script} {worker.name}",
            rerun_on_change=False,
        )
