"""Layer 4: kubeadm on the prepared nodes: init, serialized control-plane joins, workers, Flannel, verify.

Order (each arrow is a dependency in the graph, not a registration order):
  node ready -> prepare (every node, in parallel)
  prepare m01 + both balancers -> init on m01 (creates the cluster once; a no-op when one exists)
  init -> leave guard, refresh, join for m01 -> ... for m02 -> ... for m03   (one at a time)
  init -> leave guard, refresh, join for worker N   (workers in parallel)
  join -> upgrade steps of that node (no-ops unless it is at another version, see below)
  init -> Flannel;   every join, upgrade step + Flannel -> verify;   last control plane's upgrade -> kubeconfig
Every control plane joins, the first included: on the first `up` its join finds it a member
already; a VM that replaced it joins the running cluster instead of creating a second one.

Cluster-wide steps (refresh, Flannel, verify, kubeconfig, the leave guards, the teardown guard)
connect to the VIP's SSH port, which HAProxy forwards to the first healthy control plane: no
single node is needed for them (docs/cluster.md, "No single management node").

A node's leave guard sits between its VM and its join. Its create does nothing; its delete drains
the node, deletes its Node object and, for a control plane, removes its etcd member. Its triggers
are the VM's id, so it is deleted (its delete runs) before the VM goes: when the node leaves the
config, and when the VM is replaced (the fleet replaces VMs delete-before-replace, and the engine
deletes dependents whose inputs come from the VM first). A join never reads `kubeadm init` output:
the CA hash comes from its own refresh step.

Upgrades (labs-k8s:kubernetes.version; docs/runbook.md "Upgrading Kubernetes"). Every node has
upgrade steps: `<cp>-upgrade` on each control plane; `<w>-upgrade-drain` (cluster-wide),
`<w>-upgrade` (on the worker) and `<w>-upgrade-uncordon` (cluster-wide) for each worker. Their
triggers are their own bundle only (the version is in it), so they run again when the version
changes and never because something upstream was replaced: at creation and on a node that is
already at the version they find nothing to do. When the last deployment's records do not prove
every node at the configured version (components/upgrade.py), they form kubeadm's chain:
  init -> join m01 -> upgrade m01 (apply) -> refresh, join m02 -> upgrade m02 -> ... m03
  last control plane's upgrade -> every worker's join -> drain, upgrade, uncordon of w01 -> ... w02
with `kubernetes.upgrade.workersAtOnce` lanes of workers (worker i after worker i - lanes). A node
that joins during a minor upgrade so joins after the control planes are at the new version
(kubeadm join refuses a kubelet newer than the control plane). Otherwise (creation, no version
change) the upgrade steps run in parallel, right after their node's join, and the joins keep the
order above without the upgrade steps in between.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import pulumi
import pulumi_random as random
from pulumi_command import remote

from components import remote as steps
from components import upgrade as upgrades
from components.config import LabConfig, Node, Role
from components.previous_state import PreviousState, renewal_due
from components.rendering import k8s as k8s_rendering

# Joins that printed one of these finished; anything else (or no join in the last state) means a
# join is pending, and its refresh must run again before it (the join material expires).
JOIN_DONE = ("joined", "already-joined")


class KubeadmCluster(pulumi.ComponentResource):
    """The HA control plane behind the VIP, the workers, the CNI and a final verification."""

    def __init__(
        self,
        name: str,
        lab: LabConfig,
        vms: Mapping[str, pulumi.CustomResource],
        ready: dict[str, pulumi.Resource],
        balancers_ready: Sequence[pulumi.Resource],
        private_key: pulumi.Input[str],
        pins: steps.HostPins,
        previous: PreviousState | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("labs-k8s:k8s:KubeadmCluster", name, None, opts)
        # Every step pins its host's key (remote.RemoteSteps): the token and the certificate key go
        # only to a host that has it.
        self._steps = steps.RemoteSteps(lab, private_key, self, pins, library=k8s_rendering.step_library())
        child = pulumi.ResourceOptions(parent=self)
        self._lab = lab
        self._previous = previous or PreviousState(available=False)

        # The token `kubeadm init` creates, generated once per stack and kept in state as secrets
        # ([a-z0-9]{6}.[a-z0-9]{16}). No join uses it: each join generation draws its own
        # (_join_token), and verify-cluster deletes both once every node has joined.
        token_id = random.RandomPassword("bootstrap-token-id", length=6, special=False, upper=False, opts=child)
        token_secret = random.RandomPassword(
            "bootstrap-token-secret", length=16, special=False, upper=False, opts=child
        )
        self.token: pulumi.Output[str] = pulumi.Output.secret(
            pulumi.Output.concat(token_id.result, ".", token_secret.result)
        )
        certificate_key = random.RandomId(
            "certificate-key",
            byte_length=32,
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["hex", "b64Std", "b64Url", "dec"]),
        )
        self.certificate_key: pulumi.Output[str] = pulumi.Output.secret(certificate_key.hex)
        # The key kube-apiserver encrypts Secrets in etcd with (secretbox), once per stack, never
        # replaced: only init and the control planes' joins get it, in their stdin (docs/cluster.md).
        encryption_key = random.RandomId(
            "secrets-encryption-key",
            byte_length=k8s_rendering.ENCRYPTION_KEY_BYTES,
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["hex", "b64Std", "b64Url", "dec"]),
        )
        self.encryption_key: pulumi.Output[str] = pulumi.Output.secret(
            encryption_key.hex.apply(k8s_rendering.encryption_key_from_hex)
        )

        first = lab.control_planes[0]
        self.first_control_plane = first

        self.prepared: dict[str, remote.Command] = {
            # It also installs lib.sh and upgrade-lib.sh, which every later step on the node copies.
            node.name: self._steps.prepare(
                k8s_rendering.prepare_step_name(node),
                node,
                steps.Script(
                    lambda node=node: k8s_rendering.prepare_files(lab, node), k8s_rendering.PREPARE_ENTRYPOINT
                ),
                after=[ready[node.name]],
                timeout="40m",
            )
            for node in lab.kubernetes_nodes
        }

        self.init = self._steps.on_node(
            f"{first.name}-kubeadm-init",
            first,
            steps.Script(
                lambda token, key, encryption: k8s_rendering.init_files(lab, token, key, encryption),
                k8s_rendering.INIT_ENTRYPOINT,
                secrets=[self.token, self.certificate_key, self.encryption_key],
            ),
            after=[self.prepared[first.name]],
            # The VIP must answer before init (controlPlaneEndpoint points there), but a balancer's
            # re-run (a new HAProxy config) is no reason to re-run init and everything after it.
            order_after=balancers_ready,
        )

        # The upgrade chain is serialized unless the last deployment proves every node at the version.
        self.rolling = upgrades.rolling_upgrade(lab, upgrades.records_from_previous(self._previous))
        self.upgrades: dict[str, list[remote.Command]] = {}

        # Control planes join one at a time (two joins at once race on etcd membership); their
        # leave guards are chained the same way, so removing several removes their etcd members
        # one after the other, last first. During an upgrade each one's upgrade comes before the
        # next one's join.
        self.leaves: dict[str, remote.Command] = {}
        self.refreshes: dict[str, remote.Command] = {}
        self.joins: dict[str, remote.Command] = {}
        # Each node's join token's ID (its public half), for verify-cluster to delete it.
        self.join_token_ids: dict[str, pulumi.Output[str]] = {}
        previous_join: remote.Command = self.init
        previous_upgrade: remote.Command | None = None
        previous_leave: remote.Command | None = None
        for node in lab.control_planes:
            leave = self._leave_guard(node, vms[node.name], after=[self.init, *filter(None, [previous_leave])])
            previous_leave = leave
            # The order of an upgrade is not a reason to re-run a join (order_after: no trigger).
            order = [previous_upgrade] if self.rolling and previous_upgrade else []
            previous_join = self._refresh_and_join(
                node, vms[node.name], after=previous_join, leave=leave, order_after=order
            )
            previous_upgrade = self._upgrade_control_plane(node, after=previous_join)
        assert previous_upgrade is not None  # config validation: at least one control plane
        last_control_plane = previous_upgrade

        # Workers join in parallel, each with freshly refreshed join material; during an upgrade,
        # once every control plane is at the new version.
        for node in lab.workers:
            leave = self._leave_guard(node, vms[node.name], after=[self.init])
            order = [last_control_plane] if self.rolling else []
            self._refresh_and_join(node, vms[node.name], after=self.init, leave=leave, order_after=order)
        self._upgrade_workers()

        self.flannel = self._steps.through_vip(
            "flannel",
            steps.Script(lambda: k8s_rendering.flannel_files(lab), k8s_rendering.FLANNEL_ENTRYPOINT),
            order_after=[self.init],
        )

        self.verify = self._steps.through_vip(
            "verify-cluster",
            steps.Script(
                lambda: k8s_rendering.verify_files(lab),
                k8s_rendering.VERIFY_ENTRYPOINT,
                # Deletes the bootstrap tokens (init's and every join generation's) once every node
                # has joined. An ID is a token's public half (kubeadm looks the secret up by it), so
                # the step stays without secrets.
                args=[pulumi.Output.unsecret(token_id.result), *self.join_token_ids.values()],
            ),
            after=[*self.joins.values(), *self.upgrade_steps(), self.flannel],
            timeout="20m",
        )

        # The exported kubeconfig's client certificate lives a year: when the last export is within
        # RENEW_BEFORE_DAYS of expiring, the step runs again (and renews before printing).
        renew = renewal_due(
            self._previous.stack_outputs.get("kubeconfigValidUntil"), k8s_rendering.KUBECONFIG_RENEW_BEFORE_DAYS
        )
        # The kubeconfig leaves the node sealed with this key: even an error text holding the
        # step's stdout holds no credential (k8s_rendering.seal_kubeconfig).
        transport_key = pins.derived_secret("kubeconfig transport")
        self.kubeconfig_step = self._steps.through_vip(
            "kubeconfig",
            steps.Script(
                lambda key: k8s_rendering.kubeconfig_files(lab, key),
                k8s_rendering.KUBECONFIG_ENTRYPOINT,
                secrets=[transport_key],
            ),
            # kubeadm renews admin.conf's certificate on every control plane it upgrades: a new version
            # re-exports the kubeconfig once the last control plane is done (the version trigger).
            order_after=[self.init, last_control_plane],
            # The admin credentials: a secret in the state, printed only by a host with the control
            # planes' key (a forged one would send kubectl to another API server, trusting another CA).
            prints_secret=True,
            rerun_with=[
                self._previous.next_generation("kubeconfig", "kubeconfig-renewal", renew),
                f"kubernetes:{lab.kubernetes.version}",
            ],
        )
        self.kubeconfig: pulumi.Output[str] = pulumi.Output.secret(
            pulumi.Output.all(self.kubeconfig_step.stdout, transport_key).apply(
                lambda out: k8s_rendering.unseal_kubeconfig(str(out[0]), str(out[1]))
            )
        )
        self.kubeconfig_valid_until = pulumi.Output.unsecret(
            self.kubeconfig.apply(k8s_rendering.kubeconfig_valid_until)
        )

        # Deleted first on `pulumi destroy` (it depends on every leave guard): its delete marks the
        # teardown in the cluster, so the leave guards drain and remove nothing. Never replaced (a
        # replacement would run its delete during an ordinary `up`); a new script is an update.
        # Bounded like every step: with no healthy control plane it fails within minutes.
        self.teardown_guard = self._steps.guard(
            "teardown-guard",
            steps.Script(lambda: k8s_rendering.teardown_guard_files(), k8s_rendering.TEARDOWN_ENTRYPOINT),
            after=[self.init, *self.leaves.values()],
            replaced_with=[],
            # If it is ever replaced (a guard deletes first): mark, then clear; never clear, then mark.
            on_create=("clear",),
            on_delete=("set",),
            timeout="5m",
            # The first thing `pulumi destroy` deletes: it gives up within minutes.
            delete_timeout="5m",
        )
        self.register_outputs({"kubeconfig": self.kubeconfig})

    def _join_token(self, node: Node, vm: pulumi.CustomResource, attempt: str) -> pulumi.Output[str]:
        """The bootstrap token `node` joins with: drawn anew for each join generation of the node
        (its VM, replaced or new; a join attempt after an unfinished one, `attempt`), so a token
        seen by a node, its step directory or a log is worth nothing to the next join, and
        verify-cluster deletes it once every node has joined. One per node, not one per `up`: a
        node already joined keeps its token in its bundles, and so is not re-run because another
        node joins. One draw of 22 characters, split as kubeadm's [a-z0-9]{6}.[a-z0-9]{16}."""
        drawn = random.RandomPassword(
            f"{node.name}-join-token",
            length=k8s_rendering.TOKEN_ID_LENGTH + k8s_rendering.TOKEN_SECRET_LENGTH,
            special=False,
            upper=False,
            keepers={"vm": vm.id, "joinAttempt": attempt},
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.join_token_ids[node.name] = pulumi.Output.unsecret(drawn.result.apply(k8s_rendering.drawn_token_id))
        return pulumi.Output.secret(drawn.result.apply(k8s_rendering.drawn_token))

    def _join_certificate_key(self, node: Node, vm: pulumi.CustomResource, attempt: str) -> pulumi.Output[str]:
        """The key a control plane's refresh uploads the CA keys under and its join decrypts them
        with, drawn anew per join generation like the token (_join_token): a key seen by one join
        (its step directory, a log) decrypts nothing a later upload holds. init keeps the stack's."""
        drawn = random.RandomId(
            f"{node.name}-certificate-key",
            byte_length=32,
            keepers={"vm": vm.id, "joinAttempt": attempt},
            opts=pulumi.ResourceOptions(parent=self, additional_secret_outputs=["hex", "b64Std", "b64Url", "dec"]),
        )
        return pulumi.Output.secret(drawn.hex)

    def _refresh_and_join(
        self,
        node: Node,
        vm: pulumi.CustomResource,
        after: pulumi.Resource,
        leave: remote.Command,
        order_after: Sequence[pulumi.Resource] = (),
    ) -> remote.Command:
        """Right before `node` joins: re-upload the control-plane certificates (2 h) and create
        the node's join token (24 h), then join with the CA hash the refresh printed. When the last
        `up` left this node's join unfinished, the refresh runs again even though nothing else
        changed: a join retried hours later needs fresh material (the `join-attempt:N` trigger),
        and gets a fresh token too (_join_token)."""
        lab = self._lab
        join_name = f"{node.name}-kubeadm-join"
        refresh_name = f"{node.name}-refresh-join-material"
        pending = self._previous.stdout(join_name) not in JOIN_DONE
        attempt = self._previous.next_generation(refresh_name, "join-attempt", pending)
        token = self._join_token(node, vm, attempt)
        # The certificate key (it decrypts the cluster's CA keys in kubeadm-certs) goes only where
        # certificates are uploaded: before a control plane's join, never before a worker's.
        refresh_files: Callable[..., dict[str, str]]  # (token, key) for a control plane, (token) for a worker
        certificate_key = self._join_certificate_key(node, vm, attempt) if node.role is Role.CONTROL_PLANE else None
        if node.role is Role.CONTROL_PLANE:
            refresh_files = lambda token, key: k8s_rendering.refresh_files(lab, token, key, node)  # noqa: E731
            refresh_secrets = [token, certificate_key]
        else:
            refresh_files = lambda token: k8s_rendering.refresh_files(lab, token, None, node)  # noqa: E731
            refresh_secrets = [token]
        refresh = self._steps.through_vip(
            refresh_name,
            steps.Script(refresh_files, k8s_rendering.REFRESH_ENTRYPOINT, secrets=refresh_secrets),
            after=[self.prepared[node.name], leave],
            # After the previous join (one control plane at a time); its re-run is no reason to
            # refresh again: this node's own steps and join attempts are.
            order_after=[after, *order_after],
            rerun_with=[attempt],
        )
        self.refreshes[node.name] = refresh
        files: Callable[..., dict[str, str]]  # (token, key, encryption key) for a control plane, (token) for a worker
        if node.role is Role.CONTROL_PLANE:
            files = lambda token, key, encryption: k8s_rendering.control_plane_join_files(  # noqa: E731
                lab, node, token, key, encryption
            )
            # The Secrets' key too: this node's API server must read what the others encrypted.
            secrets = [token, certificate_key, self.encryption_key]
            entrypoint = k8s_rendering.CONTROL_PLANE_JOIN_ENTRYPOINT
        else:
            files = lambda token: k8s_rendering.worker_join_files(lab, node, token)  # noqa: E731
            secrets = [token]
            entrypoint = k8s_rendering.WORKER_JOIN_ENTRYPOINT
        join = self._steps.on_node(
            join_name,
            node,
            steps.Script(
                files,
                entrypoint,
                secrets=secrets,
                # The CA hash the join pins, as a control plane printed it over a session pinned to
                # the control planes' key.
                args=[refresh.stdout.apply(str.strip)],
            ),
            after=[self.prepared[node.name], refresh, leave],
            # stdout ("joined") stays readable in the state: the next `up` tells a finished join by it.
            readable_stdout=True,
        )
        self.joins[node.name] = join
        return join

    def _upgrade_control_plane(self, node: Node, after: pulumi.Resource) -> remote.Command:
        """upgrade-control-plane.sh on `node` (the first: `kubeadm upgrade apply`; the others: `upgrade
        node`), after its join; one control plane at a time when the chain is serialized."""
        lab = self._lab
        step = self._steps.upgrade(
            f"{node.name}-upgrade",
            node,
            steps.Script(
                lambda: k8s_rendering.upgrade_control_plane_files(lab, node),
                k8s_rendering.UPGRADE_CONTROL_PLANE_ENTRYPOINT,
            ),
            after=[after],
            timeout="60m",  # apply: 4 components x 5 min at worst, the drain, the kubelet, the 15 min check
        )
        self.upgrades[node.name] = [step]
        return step

    def upgrade_steps(self) -> list[remote.Command]:
        return [step for chain in self.upgrades.values() for step in chain]

    def _upgrade_workers(self) -> None:
        """Per worker: drain (cluster-wide), upgrade-worker.sh on it, uncordon (cluster-wide). In the
        serialized chain, worker i starts once worker i - workersAtOnce is uncordoned (the first
        lanes once the last control plane is done): never more workers drained at once."""
        lab = self._lab

        def cordon_step(
            node: Node, action: Literal["drain", "uncordon"], depends_on: list[pulumi.Resource]
        ) -> remote.Command:
            return self._steps.upgrade(
                f"{node.name}-upgrade-{action}",
                None,
                steps.Script(
                    lambda: k8s_rendering.upgrade_drain_files(lab, node),
                    k8s_rendering.UPGRADE_DRAIN_ENTRYPOINT,
                    args=list(k8s_rendering.upgrade_drain_args(action)),
                ),
                after=depends_on,
                timeout="15m",
            )

        for item in k8s_rendering.upgrade_order(lab):
            node = item.node
            if item.kind != "worker":
                continue
            lane = [self.upgrades[name][-1] for name in item.after] if self.rolling else []
            drain = cordon_step(node, "drain", [self.joins[node.name], *lane])
            upgrade = self._steps.upgrade(
                f"{node.name}-upgrade",
                node,
                steps.Script(
                    lambda node=node: k8s_rendering.upgrade_worker_files(lab, node),
                    k8s_rendering.UPGRADE_WORKER_ENTRYPOINT,
                ),
                after=[drain],
                timeout="30m",
            )
            self.upgrades[node.name] = [drain, upgrade, cordon_step(node, "uncordon", [upgrade])]

    def _leave_guard(self, node: Node, vm: pulumi.CustomResource, after: Sequence[pulumi.Resource]) -> remote.Command:
        """The step whose delete makes `node` leave the cluster (leave-cluster.sh) before its VM
        goes. Replaced only when the VM is (triggers: the VM's id), deleted before the new one is
        created; its bundle carries the script, so the delete works on any control plane."""
        step = self._steps.guard(
            f"{node.name}-leave-cluster",
            steps.Script(lambda: k8s_rendering.leave_files(node), k8s_rendering.LEAVE_ENTRYPOINT),
            after=[vm, *after],
            replaced_with=[vm.id],
        )
        self.leaves[node.name] = step
        return step
