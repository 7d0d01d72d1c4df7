"""The `drill` subcommand of `python -m components`.

Heavy imports (pyVmomi, pydantic) happen inside `run`, so adding the subcommand costs the
other subcommands nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

SCENARIO_NAMES = ("control-plane", "balancer", "worker", "drain")


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "drill",
        help="run a failure drill against the live lab (docs/drills.md)",
        description="Power off / drain one machine of the live lab, measure how the cluster copes, put it back.",
    )
    parser.add_argument("scenario", choices=SCENARIO_NAMES)
    parser.add_argument(
        "--stack",
        default=os.environ.get("STACK") or None,
        help="Pulumi stack to drill (default: $STACK; a dry run falls back to the example labs)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would happen; contact nothing")
    parser.add_argument("--node", help="the machine to drill (default: chosen by the scenario, see docs/drills.md)")
    parser.add_argument("--kubectl", default="kubectl", help="kubectl binary (a prerequisite for live drills)")


def _dry_run(scenario: str, stack: str, node: str | None) -> int:
    from components.config import LabConfigError
    from components.tools.drills.engine import Limits
    from components.tools.drills.inputs import NodeInfo
    from components.tools.drills.scenarios import SCENARIOS, plan_text
    from components.tools.offline import lab_config_from_stack

    try:
        lab = lab_config_from_stack(stack)
    except (FileNotFoundError, LabConfigError) as exc:
        print(f"cannot read the stack file of {stack!r}: {exc}", file=sys.stderr)
        return 2
    nodes = [NodeInfo(n.name, n.role.value, str(n.ip)) for n in lab.all_nodes]
    if node and node not in {n.name for n in nodes}:
        print(f"--node {node}: no such node in stack {stack!r}", file=sys.stderr)
        return 2
    # Refused as the live run would be: a plan of "0 nginx pods" for a lab without workers misleads.
    if refused := SCENARIOS[scenario].layout_problems(nodes, node):
        print(f"DRY RUN: the {scenario} drill would refuse stack {stack!r}: " + "; ".join(refused), file=sys.stderr)
        return 2
    print(plan_text(scenario, stack, nodes, str(lab.load_balancer.vip), node, Limits()))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.dry_run:
        return _dry_run(args.scenario, args.stack or "labs", args.node)
    if not args.stack:
        # A live drill powers VMs off: never on a stack nobody named (the Makefile has no default either).
        print(
            f"drill {args.scenario}: which stack? A live drill powers machines off, so it needs the stack named:\n"
            f"    python -m components drill {args.scenario} --stack <your site's stack>    (or export STACK)",
            file=sys.stderr,
        )
        return 2

    from components import vsphere as vs
    from components.tools.drills.cluster import KubectlCluster
    from components.tools.drills.inputs import InputsError, load_inputs
    from components.tools.drills.scenarios import SCENARIOS
    from components.tools.drills.vcenter import VCenterMachines

    try:
        inputs = load_inputs(args.stack)
    except InputsError as exc:
        print(exc, file=sys.stderr)
        return 2
    if shutil.which(args.kubectl) is None:
        print(f"{args.kubectl} not found: kubectl is a prerequisite for drills (docs/drills.md)", file=sys.stderr)
        return 2
    login = inputs.vcenter
    assert login is not None  # load_inputs requires it
    result = None
    try:
        with (
            vs.session(login.server, login.user, login.password, port=login.port, insecure=login.insecure) as si,
            KubectlCluster(inputs.kubeconfig, inputs.api_endpoint, kubectl=args.kubectl) as cluster,
        ):
            machines = VCenterMachines(si, inputs.stack, inputs.datacenter)
            result = SCENARIOS[args.scenario](inputs, cluster, machines, target=args.node).run()
    except vs.VSphereError as exc:
        print(f"vCenter: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if result is None:
            print("interrupted before the drill started; nothing was changed", file=sys.stderr)
            return 130
    print(result.render())
    return result.exit_code
