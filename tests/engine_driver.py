"""One `preview`, `up`, `refresh --run-program` or `destroy --run-program` of this checkout's program
on the real Pulumi CLI (tests/pulumi_engine.py).

Why a driver: the Go module proxy refuses the Python language host (pulumi-language-python,
tests/tools/toolchain/manifest.json), so `pulumi up` cannot spawn one here. The Python SDK ships
its own language server (pulumi.automation's LanguageServer): Automation API programs run through
it, the CLI connecting with `--client` (pulumi/automation/_stack.py). The program is this
checkout's `__main__.py`, run as the language host's exec script runs it (runpy, as `__main__`);
the CLI, engine, resource monitor, secrets manager, plugins and SDK are the real ones.

`--program template` runs the template layer alone: the same GoldenTemplate component the program
registers, with the same stack inputs, and nothing else. It exists because `--target` cannot stop
the engine from loading the vsphere provider plugin (the engine registers, and so loads, every
default provider the program asks for, targeted or not), and that plugin is refused here.

Run inside the test's network namespace, from the workspace:
    python -m tests.engine_driver --stack S --pulumi-root DIR --op preview|up|refresh|destroy [--program template]
Prints the CLI's output as it comes, then one line `ENGINE-RESULT {json}`; exits 1 on failure.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path

from pulumi import automation as auto


def program() -> None:
    runpy.run_path(str(Path.cwd() / "__main__.py"), run_name="__main__")


def template_program() -> None:
    import pulumi

    from components.stack_config import read_stack_inputs
    from components.template import GoldenTemplate

    template = GoldenTemplate("template", read_stack_inputs().lab)
    pulumi.export("templateUuid", template.uuid)
    pulumi.export("templateName", template.name)


PROGRAMS = {"main": program, "template": template_program}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stack", required=True)
    parser.add_argument("--pulumi-root", required=True, help="the directory whose bin/ holds the CLI")
    parser.add_argument(
        "--op",
        choices=["preview", "up", "refresh", "destroy"],
        required=True,
        help="refresh and destroy run the program too (`--run-program`)",
    )
    parser.add_argument("--program", choices=sorted(PROGRAMS), default="main")
    parser.add_argument("--target", action="append", default=[])
    parser.add_argument("--expect-no-changes", action="store_true")
    parser.add_argument("--refresh", action="store_true", help="destroy: refresh first (as `make destroy` does)")
    args = parser.parse_args(argv)

    command = auto.PulumiCommand(root=args.pulumi_root, skip_version_check=True)
    workspace = auto.LocalWorkspace(work_dir=str(Path.cwd()), program=PROGRAMS[args.program], pulumi_command=command)
    stack = auto.Stack.select(args.stack, workspace)

    def show(line: str) -> None:
        print(line, flush=True)

    options = {"on_output": show, "target": args.target or None, "color": "never"}
    result: dict[str, object] = {"op": args.op}
    try:
        if args.op == "preview":
            preview = stack.preview(diff=True, expect_no_changes=args.expect_no_changes or None, **options)
            result.update(ok=True, changes=preview.change_summary)
        elif args.op == "up":
            up = stack.up(**options)
            result.update(ok=True, changes=up.summary.resource_changes or {})
        elif args.op == "refresh":
            refreshed = stack.refresh(run_program=True, on_output=show, color="never")
            result.update(ok=True, changes=refreshed.summary.resource_changes or {})
        else:
            destroyed = stack.destroy(run_program=True, refresh=args.refresh, on_output=show, color="never")
            result.update(ok=True, changes=destroyed.summary.resource_changes or {})
    except auto.CommandError as error:
        result.update(ok=False, error=str(error)[-8000:])
    print("ENGINE-RESULT " + json.dumps(result, default=str), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
