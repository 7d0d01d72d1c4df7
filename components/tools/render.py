"""The offline render: plan.json, graph.mmd and the per-host files, from one mock-engine run."""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pulumi

from components.config import LabConfigError
from components.tools.artifacts import PLACEHOLDERS, host_artifacts
from components.tools.offline import (
    OfflineRun,
    Registration,
    StackFileError,
    lab_config_from_stack,
    run_document,
    run_program,
)


def plan_document(run: OfflineRun) -> list[dict[str, Any]]:
    names = {urn: reg.name for urn, reg in run.registrations.items()}
    return [
        {
            "type": reg.type,
            "name": reg.name,
            "parent": names.get(reg.parent, ""),
            "dependsOn": sorted({names[u] for u in reg.dependencies if u in names}),
            "inputs": reg.inputs,
        }
        for reg in sorted(run.registrations.values(), key=lambda r: (r.type, r.name))
    ]


def _mermaid_id(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def graph_depth(run: OfflineRun) -> int:
    """Longest dependency chain between resources (components excluded), in resources."""
    custom = {urn: reg for urn, reg in run.registrations.items() if reg.custom}
    memo: dict[str, int] = {}

    def depth(urn: str) -> int:
        if urn not in memo:
            deps = [u for u in custom[urn].dependencies if u in custom]
            memo[urn] = 1 + max((depth(u) for u in deps), default=0)
        return memo[urn]

    return max((depth(urn) for urn in custom), default=0)


def mermaid_graph(run: OfflineRun) -> str:
    """Resources as nodes, grouped by the component that owns them; edges point from a dependency."""
    regs = run.registrations
    children: dict[str, list[Registration]] = defaultdict(list)
    for reg in regs.values():
        children[reg.parent].append(reg)

    lines = ["flowchart LR"]

    def emit(component_urn: str, indent: str) -> None:
        for reg in sorted(children.get(component_urn, []), key=lambda r: r.name):
            if reg.custom:
                lines.append(f'{indent}{_mermaid_id(reg.name)}["{reg.name}<br/><small>{reg.type}</small>"]')
            else:
                lines.append(f'{indent}subgraph {_mermaid_id(reg.name)}_group["{reg.name} ({reg.type})"]')
                emit(reg.urn, indent + "  ")
                lines.append(f"{indent}end")

    roots = [urn for urn, reg in regs.items() if reg.parent not in regs]
    for parent in sorted({regs[urn].parent for urn in roots}):
        emit(parent, "  ")
    for reg in sorted(regs.values(), key=lambda r: r.name):
        if not reg.custom:
            continue
        for dep in sorted(reg.dependencies):
            if dep in regs and regs[dep].custom:
                lines.append(f"  {_mermaid_id(regs[dep].name)} --> {_mermaid_id(reg.name)}")
    return "\n".join(lines) + "\n"


def write_render(run: OfflineRun, artifacts: dict[str, dict[str, str]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(plan_document(run), indent=2, sort_keys=True) + "\n")
    (out / "graph.mmd").write_text(mermaid_graph(run))
    (out / "outputs.json").write_text(json.dumps(run.stack_outputs, indent=2, sort_keys=True) + "\n")
    for folder, files in artifacts.items():
        for relative, text in files.items():
            path = out / "hosts" / folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    notes = [
        "Rendered offline by `python -m components render`: nothing here was sent anywhere.",
        "",
        "Secrets are `[secret]` in plan.json. Generated secrets are placeholders in the files:",
    ]
    notes += [f"  {what}: {value}" for what, value in PLACEHOLDERS.items()]
    (out / "README.txt").write_text("\n".join(notes) + "\n")


def render(stack: str, out: Path, fingerprint_key_file: Path | None = None) -> int:
    """Write the render into `out`. With `fingerprint_key_file` (what `diff` passes) also run.json:
    every resource with its options and inputs, each secret as an HMAC under that file's key."""
    try:
        lab = lab_config_from_stack(stack)
        run = run_program(stack)
    except StackFileError as error:
        print(f"render: {error}", file=sys.stderr)
        return 2
    except LabConfigError as error:
        print(error, file=sys.stderr)
        return 2
    except pulumi.RunError as error:
        print(error, file=sys.stderr)
        return 2
    write_render(run, host_artifacts(lab), out)
    if fingerprint_key_file is not None:
        document = run_document(run, fingerprint_key_file.read_bytes())
        (out / "run.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(
        f"rendered {len(run.registrations)} resources (graph depth {graph_depth(run)}) "
        f"and {sum(len(f) for f in host_artifacts(lab).values())} files into {out}"
    )
    return 0
