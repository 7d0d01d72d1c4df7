"""The README and docs say what the code does: commands, targets, config keys, links, the graph."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.config import LabConfig
from components.offline import REPO_ROOT
from components.render_cli import mermaid_graph
from tests.sandbox import Sandbox

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def code_lines(path: Path) -> list[str]:
    """Lines inside fenced code blocks and inline code spans."""
    text = path.read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    lines += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return lines


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z-]*):", (REPO_ROOT / "Makefile").read_text(), flags=re.M))


def test_readme_has_exactly_two_set_up_commands():
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert len(block) == 1
    commands = [line.split("#")[0].strip() for line in block[0].splitlines() if line.strip()]
    assert commands == ["make up", "make test"]


def test_ci_runs_the_readme_test_command():
    run = (REPO_ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", run, flags=re.M)
    assert "CI=true" in run


def test_make_up_runs_pulumi_up_on_the_labs_stack():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "STACK ?= labs" in makefile
    # Its recipe's last line hands over to the CLI (after the checks of components/first_run.py).
    # (without SSH_AUTH_SOCK: a stale agent socket fails every remote step, tests/test_first_install.py)
    assert re.search(r"^up: .*\n(?:\t.*\n)*?\t\$\(NO_AGENT\) pulumi up --stack \$\(STACK\)$", makefile, flags=re.M)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_make_targets_in_docs_exist(doc):
    targets = makefile_targets()
    for line in code_lines(doc):
        for target in re.findall(r"\bmake ([a-z][a-z-]*)", line):
            assert target in targets, f"{doc.name}: make {target}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_components_commands_in_docs_parse(doc):
    for line in code_lines(doc):
        match = re.search(r"python -m components (\w+)", line)
        if match:
            result = subprocess.run(
                [sys.executable, "-m", "components", match.group(1), "--help"],
                cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
            )
            assert result.returncode == 0, f"{doc.name}: {line}: {result.stderr}"


def _resolves(path: str) -> bool:
    model: type = LabConfig
    for part in path.split("."):
        part = part.split("[")[0]
        fields = {(f.validation_alias or name): f for name, f in model.model_fields.items()}
        fields.update({name: f for name, f in model.model_fields.items()})
        if part not in fields:
            return False
        annotation = fields[part].annotation
        inner = getattr(annotation, "__args__", None)
        candidates = [annotation, *(inner or ())]
        nested = [c for c in candidates if isinstance(c, type) and hasattr(c, "model_fields")]
        if nested:
            model = nested[0]
    return True


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_config_keys_in_docs_exist(doc):
    text = doc.read_text()
    for key in re.findall(r"labs-k8s:([a-zA-Z][\w.\[\]]*[\w\]])(?![\w:\[\]])", text):  # not type tokens
        if key == "sshPrivateKey":
            continue
        assert _resolves(key), f"{doc.name}: labs-k8s:{key} is not a config key"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_local_links_resolve(doc):
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
        assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_committed_graph_is_current(offline_run):
    committed = (REPO_ROOT / "docs" / "graph.mmd").read_text()
    assert committed == mermaid_graph(offline_run), (
        "docs/graph.mmd is stale: python -m components render --out render && cp render/graph.mmd docs/"
    )


# --------------------------------------------------------------------------- the README's first lab

# Step 1 installs real tools and clones the repository: the sandbox stands in for what they give.
NOT_RUN_HERE = (
    "sudo apt-get install -y git python3-venv xorriso curl openssh-client make",
    'curl -fsSL https://get.pulumi.com | sh && export PATH="$HOME/.pulumi/bin:$PATH"',
    "git clone https://github.com/<your-org>/labs-k8s.git && cd labs-k8s",
)


def first_lab_blocks(variant: str) -> list[str]:
    """The `sh` blocks of "Your first lab", in order, for one backend variant."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Your first lab", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"(?:<!-- first-lab: ([\w-]+) -->\n)?```sh\n(.*?)```", section, flags=re.S)
    assert {marker for marker, _ in blocks} == {"", "pulumi-cloud", "self-managed"}
    return [body for marker, body in blocks if marker in ("", variant)]


def commands_of(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("variant", ["pulumi-cloud", "self-managed"])
def test_the_readme_first_lab_run_in_order_reaches_pulumi_up(tmp_path, variant):
    blocks = first_lab_blocks(variant)
    assert commands_of(blocks[0]) == list(NOT_RUN_HERE)
    setup = (REPO_ROOT / "README.md").read_text().split("## Set up", 1)[1]
    first_setup_command = re.search(r"```sh\n(.*?)\n", setup).group(1).split("#")[0].strip()
    assert first_setup_command == "make up"
    script = "\n".join(line for block in blocks[1:] for line in commands_of(block)) + "\nmake up\n"

    box = Sandbox(tmp_path)
    editor = tmp_path / "editor"  # the user's edit (step 4): this site's datacenter
    editor.write_text("#!/bin/sh\nsed -i 's/datacenter: Datacenter/datacenter: DC-Berlin/' \"$1\"\n")
    editor.chmod(0o755)
    result = box.run(script, stdin="hunter2\n", EDITOR=str(editor), PULUMI_ACCESS_TOKEN="pul-fake")
    assert result.returncode == 0, result.stdout + result.stderr
    commands = box.commands()
    # The stack exists before the first setting is written; `make up` finds it and runs `pulumi up`.
    assert commands.index("stack init") < commands.index("config set")
    assert commands.count("stack init") == 1
    assert box.calls()[-1] == ["up", "--stack", "mysite"]
    assert "make up: stack 'mysite' in backend" in result.stdout
    assert "to create (fake up" in result.stdout
    # Step 4's roles for the vCenter administrator come from the file the user just edited.
    assert "govc role.create labs-k8s-read StorageProfile.View" in result.stdout
    assert "-propagate=true /DC-Berlin/vm/labs-k8s" in result.stdout
    document = (box.repo / "Pulumi.mysite.yaml").read_text()
    assert "DC-Berlin" in document and "hunter2" not in document and "PRIVATE KEY" not in document
    assert ("encryptionsalt:" in document) == (variant == "self-managed")


# --------------------------------------------------------------------------- what to change for your site

# Keys of the example stack file that a site keeps as they are, so the README's checklist does not
# list them (sizing, Debian's name for the VMXNET3 NIC, choices). Every other key must be in it.
SAME_AT_EVERY_SITE = {
    "vsphere:allowUnverifiedSsl",  # false: trust vCenter's CA instead (README, step 5)
    "labs-k8s:network.interface",  # ens192: VMXNET3 in the clone's first PCIe slot
    "labs-k8s:template.diskGib", "labs-k8s:template.firmware", "labs-k8s:template.retainOnDestroy",
    *(f"labs-k8s:nodes.{role}.{size}" for role in ("balancers", "controlPlanes", "workers")
      for size in ("vcpu", "memoryMib")),
    "labs-k8s:nodes.controlPlanes.dataDiskGib", "labs-k8s:nodes.workers.dataDiskGib",
    "labs-k8s:kubernetes.version",
    "labs-k8s:ssh.user",
}


def example_keys(value: object, key: str) -> list[str]:
    """Full keys of the example's settings; lists (addresses, hosts) count as one value."""
    if isinstance(value, dict):
        return [leaf for name, inner in value.items() for leaf in example_keys(inner, f"{key}.{name}")]
    return [key]


def checklist_rows() -> list[tuple[list[str], list[str]]]:
    """Each row's first cell of "What to change for your site": (full keys, bare sub-keys)."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("### What to change for your site", 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        names = re.findall(r"`([^`]+)`", line.split("|")[1])
        rows.append(([n for n in names if ":" in n], [n for n in names if ":" not in n]))
    return rows


def test_the_site_checklist_names_every_setting_a_site_changes():
    config = yaml.safe_load((REPO_ROOT / "Pulumi.labs.yaml").read_text())["config"]
    leaves = [leaf for key, value in config.items() for leaf in example_keys(value, key)]
    rows = checklist_rows()

    def listed(leaf: str) -> bool:
        # `labs-k8s:vsphere` `datacenter`, ...: the named sub-keys; `labs-k8s:antiAffinity` alone: all of it.
        return any((leaf == full or leaf.startswith(f"{full}.")) and (not bare or leaf.rsplit(".", 1)[-1] in bare)
                   for fulls, bare in rows for full in fulls)

    unlisted = [leaf for leaf in leaves if not listed(leaf) and leaf not in SAME_AT_EVERY_SITE]
    assert not unlisted, f"README \"What to change for your site\" does not say what these must be: {unlisted}"
    assert not [key for key in SAME_AT_EVERY_SITE if key not in leaves], "a key kept as it is, not in the example"
    assert not [key for key in SAME_AT_EVERY_SITE if listed(key)], "a key both listed and kept as it is"
