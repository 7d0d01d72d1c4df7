"""Remote steps by kind (components/remote.py): each kind a small constructor, the layers use only those."""

from __future__ import annotations

import ast
import inspect
import subprocess
from pathlib import Path

import pytest

from components import remote

COMPONENTS = Path(remote.__file__).resolve().parent
KINDS = ("host_key", "on_node", "prepare", "through_vip", "guard", "upgrade")
MOST_ARGUMENTS = 8


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_takes_a_handful_of_arguments(kind: str) -> None:
    parameters = [p for p in inspect.signature(getattr(remote.RemoteSteps, kind)).parameters if p != "self"]
    assert len(parameters) <= MOST_ARGUMENTS, f"RemoteSteps.{kind} takes {len(parameters)}: {parameters}"


def test_the_public_kinds_are_the_only_constructors() -> None:
    public = {name for name, value in vars(remote.RemoteSteps).items() if callable(value) and not name.startswith("_")}
    assert public == set(KINDS)
    assert not hasattr(remote, "run_step"), "the 22-argument run_step is gone"


def _calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            found.append(ast.unparse(node.func))
        if isinstance(node, ast.Attribute) and node.attr in {"_register", "_Step"}:
            found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("layer", ["fleet.py", "loadbalancer.py", "cluster.py"])
def test_the_layers_register_steps_only_through_a_kind(layer: str) -> None:
    calls = _calls(COMPONENTS / layer)
    assert any(call.endswith(KINDS) for call in calls)
    forbidden = [c for c in calls if c.endswith(("remote.Command", "steps.command", "_register", "_Step"))]
    assert not forbidden, f"{layer} registers a step around the kinds: {forbidden}"


def test_the_check_sees_a_step_registered_around_the_kinds(tmp_path: Path) -> None:
    sneaky = tmp_path / "layer.py"
    sneaky.write_text("steps.command('x', opts=None)\nself._steps._register(spec)\n")
    assert [c for c in _calls(sneaky) if c.endswith(("steps.command", "_register"))] == [
        "steps.command",
        "self._steps._register",
        "self._steps._register",
    ]


def test_a_guards_no_op_create_reads_its_whole_bundle() -> None:
    """A guard's create runs with the bundle on stdin (pulumi-command sends it on every run): it must
    read it to the end, or the SSH client's stdin copy fails and the step ends in `EOF`
    (components/remote.py NO_OP_CREATE; the real provider's case: tests/test_real_ssh.py). Here the
    writer is `head`, 4 MiB into a 64 KiB pipe: it dies of SIGPIPE (141) when the reader ends first."""
    shown = subprocess.run(
        ["bash", "-c", f'head -c 4194304 /dev/zero | {{ {remote.NO_OP_CREATE}; }}; echo "${{PIPESTATUS[0]}}"'],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    assert shown.stdout.strip() == "0", f"the writer of the bundle saw the no-op create end first: {shown}"
