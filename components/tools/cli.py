"""The labs-k8s command line.

`python -m components render [--stack STACK] --out DIR`: what `pulumi up` would do, offline. Runs
the real program under Pulumi's mock engine (no vCenter, no network, no Pulumi CLI) and writes
plan.json, graph.mmd and every file pushed to a machine, one folder per host.

`python -m components diff [--stack STACK] --against REF [--json FILE]`: the resources and rendered
files that change between REF and the working tree, each rendered offline by its own code
(docs/pull-requests.md); a site's stack file, which git does not track, from the working tree.
Exit status 0 whether or not anything changed.

`python -m components drill <scenario> [--stack STACK] [--dry-run]`: a failure drill against the
live lab; a live drill needs the stack named (--stack or $STACK) (components/tools/drills, docs/drills.md).

`python -m components privileges [--stack labs] [--phase up|preview]`: the govc commands that
create the vCenter roles this project needs (docs/runbook.md, "vCenter privileges").

`python -m components logs --stack STACK NODE [STEP]`: a failed step's logs, from its node over
the stack's pinned SSH connection (components/tools/logs.py).

`python -m components check --stack STACK --for up|preview|destroy`: what `make up`, `make preview`
and `make destroy` run before the Pulumi CLI: the CLI, the login, the stack and its settings.

`python -m components targets --stack STACK LAYER`: the `--target` URNs, one a line, of one part of
the program (`vsphere`: the template, the VMs and the DRS rules; `template`), which
`make up LAYER=...` and `make preview LAYER=...` pass to the CLI (components/tools/targets.py).

render, diff and drill take an exported STACK as the Makefile does (render and diff fall back
to the example `labs`). They run with the project's virtualenv (`make venv`: .venv/bin/python -m components ...).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

# What every subcommand imports; the system's python3 has none of them.
PINNED_PACKAGES = ("pulumi", "pydantic", "yaml", "pyVmomi")


def require_project_virtualenv() -> None:
    """Exit with the command to use when this Python lacks the pinned packages (not the project's .venv)."""
    missing = [name for name in PINNED_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        sys.exit(
            f"python -m components: {sys.executable} does not have this project's packages "
            f"({', '.join(missing)} missing). Run it with the project's virtualenv, which `make up` creates "
            "(or `make venv` alone):\n"
            "  .venv/bin/python -m components ...    or first:  . .venv/bin/activate"
        )


def default_stack() -> str:
    """As the Makefile's `make render`: an exported STACK, else the example `labs`."""
    return os.environ.get("STACK") or "labs"


def main(argv: list[str] | None = None) -> int:
    require_project_virtualenv()
    from components.tools.drills import cli as drill_cli
    from components.tools.render import render

    parser = argparse.ArgumentParser(prog="python -m components", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    render_parser = commands.add_parser("render", help="write plan.json, graph.mmd and every pushed file")
    render_parser.add_argument(
        "--stack", default=default_stack(), help="stack whose Pulumi.<stack>.yaml to read (default: $STACK, else labs)"
    )
    render_parser.add_argument("--out", type=Path, required=True, help="output folder (created)")
    render_parser.add_argument(
        "--fingerprint-key",
        type=Path,
        metavar="FILE",
        help="also write run.json, secrets as HMACs under the key in FILE (for diff)",
    )
    diff_parser = commands.add_parser("diff", help="what changes between a git ref and the working tree, offline")
    diff_parser.add_argument(
        "--stack",
        default=default_stack(),
        help="stack whose Pulumi.<stack>.yaml to render (default: $STACK, else labs)",
    )
    diff_parser.add_argument(
        "--stack-file",
        type=Path,
        metavar="FILE",
        help="render both sides with this stack file (default: Pulumi.<stack>.yaml, from the working tree "
        "when git does not track it)",
    )
    diff_parser.add_argument("--against", required=True, metavar="REF", help="git ref to compare with (the base)")
    diff_parser.add_argument("--json", type=Path, metavar="FILE", help="also write the report as JSON (the PR comment)")
    drill_cli.add_parser(commands)
    logs_parser = commands.add_parser("logs", help="a failed step's logs, from its node over the pinned SSH connection")
    logs_parser.add_argument("--stack", default=os.environ.get("STACK") or None, help="the stack (default: $STACK)")
    logs_parser.add_argument("node", help="the node the step ran on, e.g. labs-k8s-m01")
    logs_parser.add_argument("step", nargs="?", help="the step, e.g. labs-k8s-m01-kubeadm-init (default: every step)")
    privileges_parser = commands.add_parser("privileges", help="govc commands creating the vCenter roles")
    privileges_parser.add_argument("--stack", help="fill in this stack's datacenter, folder, ... (default: variables)")
    privileges_parser.add_argument(
        "--phase",
        choices=("up", "preview"),
        default="up",
        help="up: every role; preview: the read-only role pulumi preview needs",
    )
    privileges_parser.add_argument("--principal", help="the vCenter user or group (default: the stack's vsphere:user)")
    privileges_parser.add_argument("--write-docs", action="store_true", help="rewrite docs/runbook.md's blocks")
    check_parser = commands.add_parser("check", help="before make up/preview/destroy: CLI, login, stack, settings")
    check_parser.add_argument("--stack", required=True, help="the stack make up/preview/destroy were given (STACK)")
    check_parser.add_argument("--for", dest="purpose", choices=("up", "preview", "destroy"), required=True)
    targets_parser = commands.add_parser("targets", help="the --target URNs of one layer (make up LAYER=...)")
    targets_parser.add_argument("--stack", required=True, help="the stack the URNs are in (STACK)")
    # No argparse `choices`: its message names neither LAYER nor what a layer is (targets.py does).
    targets_parser.add_argument("layer", metavar="LAYER", help="vsphere or template")
    args = parser.parse_args(argv)
    if args.command == "render":
        return render(args.stack, args.out, args.fingerprint_key)
    if args.command == "diff":
        from components.tools.render_diff import diff

        return diff(args.stack, args.against, args.json, stack_file=args.stack_file)
    if args.command == "privileges":
        from components.tools import privileges

        return privileges.cli(args.stack, args.phase, args.principal, write=args.write_docs)
    if args.command == "check":
        from components.tools import first_run

        return first_run.check(args.stack, args.purpose)
    if args.command == "targets":
        from components.tools import targets

        return targets.cli(args.stack, args.layer)
    if args.command == "drill":
        return drill_cli.run(args)
    if args.command == "logs":
        from components.tools import logs

        return logs.cli(args.stack, args.node, args.step)
    return 2


if __name__ == "__main__":
    sys.exit(main())
