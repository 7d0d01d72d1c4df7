"""Remote steps: one pulumi-command `remote.Command` per script run on a VM.

Every step is a bundle (files + entrypoint, see rendering.step_bundle) fed on stdin to
`sudo bash -s`, so the command line never carries file contents or secrets. Steps connect to
the node's configured static IP, never to what vCenter reports (pulumi/pulumi-vsphere#182).

Every connection pins the host key it expects (`hostKey`; pulumi-command 1.2.1
provider/pkg/provider/remote/connection.go `SSHConfig`: `ssh.FixedHostKey`, offering only that
key's algorithm; without one it would take any key, `ssh.InsecureIgnoreHostKey`): a node step the
node's Ed25519 key, a step through the VIP the control planes' shared ECDSA key
(rendering/host_keys.py). The handshake fails before any stdin (and so any secret) is sent to a
host without the key, and an answer is used only from a host that has it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi_command import remote

from components.config import LabConfig, Node
from components.rendering import StepLibrary, content_hash, step_bundle
from components.rendering.host_keys import HostKey
from components.rendering.lb import CONTROL_PLANE_SSH_PORT

# pulumi-command dials up to `dialErrorLimit` times; each attempt is bounded by `perDialTimeout`
# and followed by a back-off of 100 ms x1.5 per attempt, at most 5 s (pulumi-command 1.2.1
# remote/connection.go dialWithRetry, pulumi sdk/go/common/util/retry). So a host that does not
# answer fails a step after at most attempts x (per-dial timeout + 5 s): never unlimited (-1),
# or `pulumi destroy` waits for ever on a node that is gone.
PER_DIAL_TIMEOUT_SECONDS = 10
RETRY_DELAY_MAX_SECONDS = 5
# A running node: give up within 3 minutes.
STEP_DIAL_ATTEMPTS = 12
# A clone's first boot (firmware, cloud-init, host keys): 4 minutes when every dial is refused
# at once, up to 15 when every dial times out.
BOOT_DIAL_ATTEMPTS = 60
DELETE_TIMEOUT = "15m"  # a leave guard: drain (210 s at most), Node delete, etcd member
RUN_STEP = "sudo -n bash -s"
# pulumi-command 1.2.1 bounds only the dial by the step's context: `session.Run` has none
# (remote/commandOutputs.go `run`), so a script that hangs, or waits on something that never comes,
# holds `up` or `destroy` for ever. Each run of a bundle is therefore wrapped in coreutils'
# `timeout`, with a deadline that ends before the step's own timeout (less the longest dial and a
# margin). `timeout` runs the command in its own process group and signals the whole group
# (coreutils src/timeout.c, `cleanup`), so a kubeadm or apt-get the script started dies with it, and
# --kill-after follows with SIGKILL. A peer that vanished mid-step (a VM powered off, a balancer
# failover) is bounded on the client side: x/crypto/ssh's Dial uses net.DialTimeout, whose TCP
# keep-alive (Go net.Dialer, 15 s probes) ends the dead session within minutes.
# The create of a step that runs its bundle only on delete (a leave guard). It must read its stdin
# (the bundle) to the end: pulumi-command sends stdin on every run, and x/crypto/ssh's Session.Wait
# returns the stdin copy's error when the command exits 0 (golang.org/x/crypto v0.48.0
# ssh/session.go Wait, stdin). A `true` exits before the bundle is sent, sshd closes the channel,
# and the copy's write fails: the step fails with a bare `EOF` (found by the lab in a box, where it
# hit about one `up` of two through the VIP: docs/testing.md).
NO_OP_CREATE = "cat >/dev/null"
DEADLINE_MARGIN_SECONDS = 60
KILL_AFTER_SECONDS = 20
# The exit codes of `timeout` when it stopped the command (TERM: 124; KILL after --kill-after: 137).
TIMED_OUT_CODES = (124, 137)
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def duration_seconds(value: str) -> int:
    """A Pulumi custom timeout ("30m", "1h30m", "90s") in seconds."""
    match = _DURATION.match(value)
    if not value or match is None:
        raise ValueError(f"{value!r} is not a duration like 30m, 1h or 90s")
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def step_deadline_seconds(timeout: str, dial_attempts: int) -> int:
    """How long a bundle may run on the node: the step's timeout less its longest dial and a margin,
    so the node gives up (and says so) before Pulumi's own timeout would have to."""
    deadline = duration_seconds(timeout) - dial_budget_seconds(dial_attempts) - DEADLINE_MARGIN_SECONDS
    if deadline < 60:
        raise ValueError(
            f"a step timeout of {timeout} leaves {deadline}s for the script after {dial_attempts} dials: "
            "give the step a longer timeout"
        )
    return deadline


# What a step's failure text names for its node when the step runs through the VIP: the name of
# the control plane it landed on, read there at run time. Each node's hostname is its node name:
# its cloud-init sets `hostname:` to it with `prefer_fqdn_over_hostname: false`
# (cloudinit/node/user-data.yaml.j2), and the readiness step fails a node whose `hostname` is not
# (cloudinit/fleet/wait-for-cloud-init.sh), before any step through the VIP can land on it.
NODE_AT_RUN_TIME = '"$(hostname)"'


def logs_hint(step: str, node: str, stack: str) -> str:
    """The line a failed step prints on stderr: the command that collects its logs from its node
    (components/tools/logs.py). pulumi-command 1.2.1 puts a failed command's stdout and stderr in
    the step's error (remote/commandOutputs.go:101 `run`: "running %q:" and the output), so the engine shows it.
    `node` is a shell word: a quoted name, or NODE_AT_RUN_TIME. The real stack name, not "$STACK":
    the error text is then a command to paste as it stands, whichever of a user's stacks failed.
    Every part is a name from the configuration; none is a secret. The command's words are printed
    with bash's %q: a node's run-time hostname is the node's to choose, and is pasted into a shell."""
    words = [shlex.quote(step), '"$rc"', node, shlex.quote(stack), node, shlex.quote(step)]
    return (
        "printf 'labs-k8s[%s]: failed (exit %s); its logs on %q: python -m components logs --stack %q %q %q\\n' "
        f"{' '.join(words)} >&2"
    )


def bounded_run(step: str, deadline_seconds: int, node: str, stack: str, args: Sequence[str] = ()) -> str:
    """The remote command that runs a bundle from stdin with its own deadline, says so when it
    stopped it, and names the logs command when the bundle failed (`logs_hint`). It carries no
    secret: the bundle (stdin) does."""
    tail = f" -- {' '.join(shlex.quote(a) for a in args)}" if args else ""
    codes = " || ".join(f"[ $rc -eq {code} ]" for code in TIMED_OUT_CODES)
    message = shlex.quote(
        f"labs-k8s[{step}]: stopped after {deadline_seconds}s, the deadline of the step's script on the node "
        "(shorter than the step's timeout): what it waited for never came; its log above says where it was"
    )
    return (
        f"sudo -n timeout --kill-after={KILL_AFTER_SECONDS} {deadline_seconds} bash -s{tail}; rc=$?; "
        f"if {codes}; then echo {message} >&2; fi; "
        f"if [ $rc -ne 0 ]; then {logs_hint(step, node, stack)}; fi; exit $rc"
    )


def dial_budget_seconds(attempts: int) -> int:
    """The longest a step can spend dialling a host that never answers."""
    return attempts * (PER_DIAL_TIMEOUT_SECONDS + RETRY_DELAY_MAX_SECONDS)


@dataclass(frozen=True)
class HostPins:
    """What the remote steps trust: the public host key of each node (name -> "ssh-ed25519 ..."),
    the control planes' shared key on the VIP's SSH port ("ecdsa-sha2-nistp256 ..."), and the key
    of the triggers' HMAC (a stack secret, `trigger_digest`). Made by the fleet (fleet.py)."""

    nodes: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    cluster: pulumi.Input[str] = ""
    trigger_key: pulumi.Input[str] = ""
    # The control planes' host-key steps, after which every control plane presents `cluster`: every
    # step through the VIP runs after all of them (order only, no trigger). HAProxy may send a
    # session to any healthy control plane, so after a rotation of the shared key a VIP step that
    # ran while one of them still had the old key would fail with `ssh: host key mismatch`.
    cluster_presented: list[pulumi.Resource] = field(default_factory=list)

    def derived_secret(self, purpose: str) -> pulumi.Output[str]:
        """A 256-bit stack secret for `purpose`, derived from the triggers' HMAC key (no new resource)."""
        return pulumi.Output.secret(
            pulumi.Output.from_input(self.trigger_key).apply(
                lambda key: hmac.new(str(key).encode(), f"labs-k8s {purpose}".encode(), hashlib.sha256).hexdigest()
            )
        )


def trigger_digest(key: str, bundle: str) -> str:
    """What stands for a bundle with secrets in `triggers`: an HMAC-SHA256 keyed by a 256-bit stack
    secret, kept unsecret. Not the bundle's plain hash: a hash of low-entropy secrets (the 8
    characters of a VRRP password) is an offline oracle for them; without the key this one tells
    nothing. Unsecret, because pulumi-command 1.2.1 answers a secret trigger that is still unknown
    in a preview as a secret without a value, which the CLI (v3.274.1) refuses: `triggers[0]:
    malformed secret: missing value` (issue #29). Unknown in a preview is fine; secret is not."""
    return hmac.new(key.encode(), bundle.encode(), hashlib.sha256).hexdigest()[:32]


def connection(
    lab: LabConfig,
    node: Node,
    private_key: pulumi.Input[str],
    host_key: pulumi.Input[str],
    dial_attempts: int = STEP_DIAL_ATTEMPTS,
) -> remote.ConnectionArgs:
    """SSH to `node`'s address, accepting only `host_key` (its Ed25519 key)."""
    return remote.ConnectionArgs(
        host=str(node.ip),
        user=lab.ssh.user,
        private_key=private_key,
        host_key=host_key,
        dial_error_limit=dial_attempts,
        per_dial_timeout=PER_DIAL_TIMEOUT_SECONDS,
    )


def command(resource_name: str, *, opts: pulumi.ResourceOptions, **args: Any) -> remote.Command:
    """Every remote.Command of the program goes through here.

    `add_previous_output_in_env` is off: pulumi-command defaults it to true and then sends the
    previous stdout and stderr (the admin kubeconfig, for one step) as SSH environment variables
    on every update and delete (pulumi-command 1.2.1 remote/command.go).
    """
    timeouts = opts.custom_timeouts
    if timeouts is None or not (timeouts.create and timeouts.update and timeouts.delete):
        raise ValueError(f"{resource_name}: a remote command needs create, update and delete timeouts")
    return remote.Command(resource_name, add_previous_output_in_env=False, opts=opts, **args)


def cluster_connection(
    lab: LabConfig,
    private_key: pulumi.Input[str],
    host_key: pulumi.Input[str],
    dial_attempts: int = STEP_DIAL_ATTEMPTS,
) -> remote.ConnectionArgs:
    """SSH to whichever control plane is healthy: the VIP's CONTROL_PLANE_SSH_PORT, which HAProxy
    forwards to port 22 of the first control plane (config order) whose apiserver passes its
    health check. Cluster-wide steps use it, so no single control plane is needed for them.
    `host_key` is the ECDSA key every control plane presents (and only they have): landing on
    another control plane than last time is no error, landing on anything else is."""
    return remote.ConnectionArgs(
        host=str(lab.load_balancer.vip),
        port=CONTROL_PLANE_SSH_PORT,
        user=lab.ssh.user,
        private_key=private_key,
        host_key=host_key,
        dial_error_limit=dial_attempts,
        per_dial_timeout=PER_DIAL_TIMEOUT_SECONDS,
    )


@dataclass(frozen=True)
class Script:
    """What a step runs: `files(*secret values)` renders its files (scripts from `cloudinit/`, configs),
    `entrypoint` is the one run, with `args`. Secret values reach `files` only inside an Output, so the
    bundle (stdin) is a secret whenever a secret went into it."""

    files: Callable[..., dict[str, str]]
    entrypoint: str
    secrets: Sequence[pulumi.Input[Any]] = ()
    args: Sequence[pulumi.Input[str]] = ()


class RemoteSteps:
    """The remote steps of one layer, by kind. Each kind is a constructor taking only what that kind
    uses; all of them register through `_register`, so no call site can combine options into a step
    that no kind describes.

    - `host_key`: the first step on a new VM: its pinned host keys in place, a rotation installed.
    - `prepare`: an `on_node` step that also installs the layer's StepLibrary on its machine.
    - `on_node`: converges one machine; re-runs when its bundle or that machine's earlier steps or VM
      change (a replaced VM re-runs every step on it, in order).
    - `through_vip`: the same, on whichever control plane is healthy (cluster_connection).
    - `guard`: a step whose delete does the work (a node leaving the cluster, the teardown mark);
      replaced only when what it guards is, never because its script changed.
    - `upgrade`: re-runs when its own bundle (the version is in it) changes, never because something
      before it was replaced: a new or replaced node is at the version already.

    Every step's connection pins a host key (`pins`): its node's, or the control planes' shared key
    for a step through the VIP. A step with secrets, or one that prints one (`prints_secret`), has
    its stdout and stderr secret and its logging off (pulumi/pulumi-command#134, #260); its secrets
    travel in its stdin over the authenticated session.
    """

    def __init__(
        self,
        lab: LabConfig,
        private_key: pulumi.Input[str],
        parent: pulumi.Resource,
        pins: HostPins,
        library: StepLibrary | None = None,
    ) -> None:
        self._lab = lab
        self._private_key = private_key
        self._parent = parent
        self._pins = pins
        # The files many of this layer's steps share (rendering.StepLibrary): each node's step
        # registered with `installs_library` puts them on it, and the later steps there (through the
        # VIP: once every control plane has them) copy them from it rather than carry them.
        self._library = library
        self._library_installers: dict[str, tuple[str, pulumi.Resource]] = {}

    def on_node(
        self,
        name: str,
        node: Node,
        script: Script,
        *,
        after: Sequence[pulumi.Resource],
        order_after: Sequence[pulumi.Resource] = (),
        timeout: str = "30m",
        dial_attempts: int = STEP_DIAL_ATTEMPTS,
        readable_stdout: bool = False,
    ) -> remote.Command:
        """A step on `node` after `after` (that machine's earlier steps and its VM: their ids are part
        of the trigger). `order_after` only orders it: another machine's steps, whose re-run is no
        reason to re-run this one (a balancer's new HAProxy config does not re-run `kubeadm init`).
        `readable_stdout` keeps a secret step's stdout (a status word) readable in the state; stderr
        stays secret. `dial_attempts`: BOOT_DIAL_ATTEMPTS for the first step after a clone's boot."""
        return self._register(
            _Step(
                name,
                script,
                node=node,
                depends_on=after,
                order_after=order_after,
                timeout=timeout,
                dial_attempts=dial_attempts,
                readable_stdout=readable_stdout,
            )
        )

    def prepare(
        self, name: str, node: Node, script: Script, *, after: Sequence[pulumi.Resource], timeout: str
    ) -> remote.Command:
        """An `on_node` step that also puts the layer's StepLibrary on `node`: every later step there
        comes after it through its `after` (this machine's earlier steps), and copies the library
        from the node; steps through the VIP wait for every control plane's."""
        if self._library is None:
            raise ValueError(f"{name}: a prepare step installs this layer's StepLibrary, and it has none")
        step = self._register(_Step(name, script, node=node, depends_on=after, timeout=timeout, installs_library=True))
        self._library_installers[node.name] = (name, step)
        return step

    def host_key(
        self, name: str, node: Node, script: Script, *, after: Sequence[pulumi.Resource], presented: pulumi.Input[str]
    ) -> remote.Command:
        """The first step after a clone's boot, which makes `node` present its pinned host keys (the
        script gets them as secrets). It pins `presented`, the key the node has before it runs: the
        same key on a new VM, the old one when a running VM's key is rotated (fleet.rotation_pin).
        Its stdout (the public key it left in place) stays readable: the next rotation pins it."""
        boot = dial_budget_seconds(BOOT_DIAL_ATTEMPTS)
        return self._register(
            _Step(
                name,
                script,
                node=node,
                depends_on=after,
                timeout=f"{boot // 60 + 5}m",
                dial_attempts=BOOT_DIAL_ATTEMPTS,
                readable_stdout=True,
                host_key=presented,
            )
        )

    def through_vip(
        self,
        name: str,
        script: Script,
        *,
        after: Sequence[pulumi.Resource] = (),
        order_after: Sequence[pulumi.Resource] = (),
        timeout: str = "30m",
        prints_secret: bool = False,
        rerun_with: Sequence[pulumi.Input[str]] = (),
    ) -> remote.Command:
        """A cluster-wide step, on whichever control plane is healthy. `prints_secret`: its stdout is
        a secret (the admin kubeconfig) even without a secret in its bundle. `rerun_with`: re-run
        reasons beyond its content and `after` (a join retried, a kubeconfig renewal)."""
        return self._register(
            _Step(
                name,
                script,
                node=None,
                depends_on=after,
                order_after=order_after,
                timeout=timeout,
                prints_secret=prints_secret,
                rerun_with=rerun_with,
            )
        )

    def guard(
        self,
        name: str,
        script: Script,
        *,
        after: Sequence[pulumi.Resource],
        replaced_with: Sequence[pulumi.Input[Any]],
        on_create: Sequence[str] | None = None,
        on_delete: Sequence[str] = (),
        timeout: str = "30m",
        delete_timeout: str = DELETE_TIMEOUT,
    ) -> remote.Command:
        """A step through the VIP whose delete runs its bundle with `on_delete` arguments; its create
        is a no-op, or the bundle with `on_create` arguments. A new bundle is an in-place update of
        its stdin, never a reason to replace it (a replacement would run the delete during an
        ordinary `up`); `replaced_with` says exactly what replaces it (its node's VM id; nothing),
        and a replacement deletes the old one first. The delete carries its own script, so it works
        on whichever control plane it lands on."""
        return self._register(
            _Step(
                name,
                script,
                node=None,
                depends_on=after,
                timeout=timeout,
                delete_timeout=delete_timeout,
                rerun_on_change=False,
                create_args=tuple(on_create or ()),
                delete_args=tuple(on_delete),
                triggers=replaced_with,
                delete_before_replace=True,
            )
        )

    def upgrade(
        self, name: str, node: Node | None, script: Script, *, after: Sequence[pulumi.Resource], timeout: str
    ) -> remote.Command:
        """An upgrade step on `node` (None: through the VIP, a drain or an uncordon): re-run when its
        own bundle changes, never because a step or VM before it was replaced."""
        return self._register(
            _Step(name, script, node=node, depends_on=after, timeout=timeout, upstream_triggers=False)
        )

    def _register(self, step: _Step) -> remote.Command:
        """Register one remote step. A digest of the bundle is the trigger: a changed script or
        config re-runs the (idempotent) step."""
        lab, script, resource_name = self._lab, step.script, step.name
        secrets, args = script.secrets, script.args
        handles_secrets = bool(secrets) or step.prints_secret
        installs = self._library if step.installs_library else None
        from_library, library_installers = self._library_source(step)

        def bundle(values: Sequence[Any]) -> str:
            secret_values = values[: len(secrets)]
            arg_values = tuple(str(v) for v in values[len(secrets) :])
            files = script.files(*secret_values)
            # Every file that holds one of the secrets leaves the step directory when the step ends.
            texts = [t for v in secret_values for t in _secret_texts(v)]
            holding = [name for name, text in files.items() if any(t in text for t in texts)]
            return step_bundle(
                resource_name,
                files,
                script.entrypoint,
                arg_values,
                secret_files=holding,
                installs_library=installs,
                from_library=from_library,
            )

        stdin: pulumi.Input[str]
        stdin_hash: pulumi.Input[str]
        if not secrets and all(isinstance(a, str) for a in args):
            # Known now: no Output machinery (it dominates evaluation time for large labs). No secret
            # in it, so its plain hash tells nothing that its stdin in the state does not.
            stdin = bundle(list(args))
            stdin_hash = content_hash(stdin)
        else:
            stdin = pulumi.Output.all(*secrets, *args).apply(bundle)
            if secrets:
                stdin = pulumi.Output.secret(stdin)
            # Never a secret in `triggers` (trigger_digest says why): the HMAC, unsecret.
            stdin_hash = pulumi.Output.unsecret(
                pulumi.Output.all(self._pins.trigger_key, stdin).apply(lambda kv: trigger_digest(str(kv[0]), kv[1]))
            )
        # The identities of this machine's earlier steps and VM (`depends_on`, never `order_after`) are
        # part of the trigger: a replaced VM re-runs every step on it, in order (each step is guarded,
        # so re-running a done step is a no-op). Another machine's steps only order (`order_after`).
        triggers = step.triggers
        if triggers is None:
            upstream_ids = (
                [r.id for r in step.depends_on if isinstance(r, pulumi.CustomResource)]
                if step.rerun_on_change and step.upstream_triggers
                else []
            )
            triggers = [stdin_hash, *upstream_ids, *step.rerun_with] if step.rerun_on_change else []
        through_vip = (
            [] if step.node is not None else [r for r in self._pins.cluster_presented if r not in step.order_after]
        )
        # Order only: a node's library comes with a step already among `depends_on` (its prepare),
        # a step through the VIP waits for every control plane's, with no trigger.
        library_order = [r for r in library_installers if r not in (*step.depends_on, *step.order_after)]
        options = pulumi.ResourceOptions(
            parent=self._parent,
            depends_on=[*step.depends_on, *step.order_after, *through_vip, *library_order],
            custom_timeouts=pulumi.CustomTimeouts(create=step.timeout, update=step.timeout, delete=step.delete_timeout),
            additional_secret_outputs=(
                (["stderr"] if step.readable_stdout else ["stdout", "stderr"]) if handles_secrets else None
            ),
            # pulumi-command replaces a Command when its triggers change (schema: triggers[*]); a step
            # that is not re-run on change takes a new bundle as an in-place update of its stdin.
            replace_on_changes=["triggers"],
            delete_before_replace=step.delete_before_replace,
            # No ignoreChanges on `connection`: pulumi-command replaces a Command only when `triggers`
            # change (v1.2.1 provider/pkg/provider/common ResourceInputs; `connection` carries no
            # replaceOnChanges), so an SSH key rotation is an in-place update that re-runs the no-op
            # create and stores the new key, which a later delete (a node leaving) logs in with.
        )
        dials = step.dial_attempts
        # A failed step names the node it ran on: its own, or the control plane the VIP led it to.
        node = NODE_AT_RUN_TIME if step.node is None else shlex.quote(step.node.name)
        stack = pulumi.get_stack()
        create = NO_OP_CREATE
        if step.rerun_on_change:
            create = bounded_run(resource_name, step_deadline_seconds(step.timeout, dials), node, stack)
        if step.create_args:
            create = bounded_run(
                resource_name, step_deadline_seconds(step.timeout, dials), node, stack, step.create_args
            )
        delete = None
        if step.delete_args is not None:
            delete = bounded_run(
                resource_name, step_deadline_seconds(step.delete_timeout, dials), node, stack, step.delete_args
            )
        if step.node is None:
            target = cluster_connection(lab, self._private_key, self._pins.cluster, dials)
        else:
            pin = step.host_key if step.host_key is not None else self._pins.nodes[step.node.name]
            target = connection(lab, step.node, self._private_key, pin, dials)
        command_resource = command(
            resource_name,
            connection=target,
            create=create,
            stdin=stdin,
            delete=delete,
            triggers=list(triggers),
            logging=remote.Logging.NONE if handles_secrets else remote.Logging.STDOUT_AND_STDERR,
            opts=options,
        )
        return command_resource

    def _library_source(self, step: _Step) -> tuple[tuple[StepLibrary, str] | None, list[pulumi.Resource]]:
        """Where `step` takes the library from, and the steps that must have installed it first: its
        node's installer, or, through the VIP, every control plane's (the VIP's SSH port may lead to
        any of them). None: the step carries the library itself. So do the guards: their delete runs
        at `destroy` or when a node leaves, on whichever control plane, with the bundle of an earlier
        `up`, and must not depend on what a node's disk still holds."""
        library = self._library
        if library is None or step.installs_library or not step.rerun_on_change:
            return None, []
        if step.node is not None:
            # Ordered by its `after` already (the node's own chain): no extra dependency.
            installer = self._library_installers.get(step.node.name)
            return ((library, installer[0]), []) if installer else (None, [])
        planes = [self._library_installers.get(node.name) for node in self._lab.control_planes]
        if not all(planes):
            return None, []
        return (library, "each control plane's prepare step"), [plane[1] for plane in planes if plane]


def _secret_texts(value: Any) -> list[str]:
    """The text by which a secret value shows in a file: a host key by its private key."""
    if isinstance(value, HostKey):
        return [value.private_openssh]
    text = str(value)
    return [text] if text else []


@dataclass(frozen=True)
class _Step:
    """Everything `_register` can be told; only the kinds of RemoteSteps fill it in."""

    name: str
    script: Script
    node: Node | None
    depends_on: Sequence[pulumi.Resource]
    timeout: str
    order_after: Sequence[pulumi.Resource] = ()
    dial_attempts: int = STEP_DIAL_ATTEMPTS
    readable_stdout: bool = False
    host_key: pulumi.Input[str] | None = None
    prints_secret: bool = False
    rerun_with: Sequence[pulumi.Input[Any]] = ()
    upstream_triggers: bool = True
    rerun_on_change: bool = True
    create_args: Sequence[str] = ()
    delete_args: Sequence[str] | None = None
    triggers: Sequence[pulumi.Input[Any]] | None = None
    delete_before_replace: bool = False
    delete_timeout: str = DELETE_TIMEOUT
    installs_library: bool = False
