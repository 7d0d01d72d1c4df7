"""Remote steps: one pulumi-command `remote.Command` per script run on a VM.

Every step is a bundle (files + entrypoint, see rendering.step_bundle) fed on stdin to
`sudo bash -s`, so the command line never carries file contents or secrets. Steps connect to
the node's configured static IP, never to what vCenter reports (pulumi/pulumi-vsphere#182).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pulumi
from pulumi_command import remote

from components.config import LabConfig, Node
from components.rendering import content_hash, step_bundle

# Unlimited dial retries while a VM boots; the overall bound is the resource's create timeout.
DIAL_RETRIES_UNLIMITED = -1
PER_DIAL_TIMEOUT_SECONDS = 10
RUN_STEP = "sudo -n bash -s"


def connection(lab: LabConfig, node: Node, private_key: pulumi.Input[str]) -> remote.ConnectionArgs:
    return remote.ConnectionArgs(
        host=str(node.ip),
        user=lab.ssh.user,
        private_key=private_key,
        dial_error_limit=DIAL_RETRIES_UNLIMITED,
        per_dial_timeout=PER_DIAL_TIMEOUT_SECONDS,
    )


def run_step(
    resource_name: str,
    *,
    lab: LabConfig,
    node: Node,
    private_key: pulumi.Input[str],
    files: Callable[..., dict[str, str]],
    entrypoint: str,
    secrets: Sequence[pulumi.Input[str]] = (),
    args: Sequence[pulumi.Input[str]] = (),
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
    handles_secrets: bool = False,
    delete: str | None = None,
    timeout: str = "30m",
    rerun_on_change: bool = True,
) -> remote.Command:
    """Register one remote step.

    `files(*secret_values)` renders the step's files; secret values reach it only inside an
    Output, so the bundle (stdin) is a secret whenever a secret went into it. The content hash
    of the bundle is the trigger: a changed script or config re-runs the (idempotent) step.
    A step that handles secrets also has its stdout/stderr secret and its logging off
    (pulumi/pulumi-command#134, #260).

    `rerun_on_change=False` is for steps whose delete does real work (draining a node):
    replacing them would run that delete against a live node, so they are never replaced.
    """
    step_name = resource_name

    def bundle(values: Sequence[Any]) -> str:
        secret_values = values[: len(secrets)]
        arg_values = tuple(str(v) for v in values[len(secrets) :])
        return step_bundle(step_name, files(*secret_values), entrypoint, arg_values)

    stdin: pulumi.Input[str]
    stdin_hash: pulumi.Input[str]
    if not secrets and all(isinstance(a, str) for a in args):
        # Known now: no Output machinery (it dominates evaluation time for large labs).
        stdin = bundle(list(args))
        stdin_hash = content_hash(stdin)
    else:
        stdin = pulumi.Output.all(*secrets, *args).apply(bundle)
        if secrets:
            stdin = pulumi.Output.secret(stdin)
        stdin_hash = stdin.apply(content_hash)
    # The identities of upstream steps and VMs are part of the trigger: a replaced VM re-runs
    # every step after it, in order (each step is guarded, so re-running a done step is a no-op).
    upstream_ids = [r.id for r in depends_on if isinstance(r, pulumi.CustomResource)] if rerun_on_change else []
    options = pulumi.ResourceOptions(
        parent=parent,
        depends_on=list(depends_on),
        custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout, delete="10m"),
        additional_secret_outputs=["stdout", "stderr"] if handles_secrets else None,
        # pulumi-command replaces a Command when its triggers change (schema: triggers[*]).
        ignore_changes=None if rerun_on_change else ["stdin", "triggers"],
    )
    return remote.Command(
        resource_name,
        connection=connection(lab, node, private_key),
        create=RUN_STEP,
        stdin=stdin,
        delete=delete,
        triggers=[stdin_hash, *upstream_ids],
        logging=remote.Logging.NONE if handles_secrets else remote.Logging.STDOUT_AND_STDERR,
        opts=options,
    )
