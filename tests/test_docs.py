"""The README and docs say what the code does: commands, targets, config keys, links, the graph."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.config import LabConfig
from components.tools.offline import REPO_ROOT
from components.tools.render import mermaid_graph
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


def test_make_up_runs_pulumi_up_on_the_stack_it_is_given():
    makefile = (REPO_ROOT / "Makefile").read_text()
    # No default: a forgotten `export STACK` must not create the example stack (tests/test_first_install.py).
    assert re.search(r"^STACK \?=$", makefile, flags=re.M)
    assert re.search(r"^up: stack-named venv$", makefile, flags=re.M)
    # Its recipe's last line hands over to the CLI (after the checks of components/tools/first_run.py).
    # (without SSH_AUTH_SOCK: a stale agent socket fails every remote step, tests/test_first_install.py)
    # ARGS (empty unless given) passes --yes, --target, --replace or --parallel through (issue 33),
    # after LAYER's targets (empty unless LAYER is given: tests/test_first_install.py), unexpanded
    # (USER_ARGS: a URN's `$`, tests/test_first_install.py).
    assert re.search(
        r"^up: .*\n(?:\t.*\n)*?\t\$\(LAYER_TARGETS\) \$\(USER_ARGS\) \$\(NO_AGENT\) pulumi up --stack \$\(STACK\) "
        r'"\$\$\{layer_targets\[@\]\}" "\$\$\{user_args\[@\]\}" \$\(AGAIN_HINT\)$',
        makefile,
        flags=re.M,
    )
    # A failed `up` says what to do next (docs/runbook.md, "When a step fails half-way";
    # tests/test_first_install.py::test_a_failed_up_says_what_to_do).
    assert re.search(r"^AGAIN_HINT = \|\| \{ rc=\$\$\?; .*exit \$\$rc; \}$", makefile, flags=re.M)


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
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
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
    # Step 7 is its own `make up`: the path never lands on the Set up block, where `make test` stands (issue 33).
    assert commands_of(blocks[-1]) == ["make up"]
    script = "\n".join(line for block in blocks[1:] for line in commands_of(block)) + "\n"

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
    # ... and are granted to the account step 5 set, not to a placeholder left for the reader.
    assert "$PRINCIPAL" not in result.stdout
    assert re.search(r"govc permissions.set -principal labs-k8s@vsphere.local ", result.stdout), result.stdout
    document = (box.repo / "Pulumi.mysite.yaml").read_text()
    assert "DC-Berlin" in document and "hunter2" not in document and "PRIVATE KEY" not in document
    assert ("encryptionsalt:" in document) == (variant == "self-managed")


# --------------------------------------------------------------------------- what to change for your site

# Keys of the example stack file that a site keeps as they are, so the README's checklist does not
# list them (sizing, Debian's name for the VMXNET3 NIC, choices). Every other key must be in it.
SAME_AT_EVERY_SITE = {
    "vsphere:allowUnverifiedSsl",  # false: trust vCenter's CA instead (README, step 5)
    "vsphere:apiTimeout",  # follows the disk sizes; the program names the value when they grow
    "labs-k8s:network.interface",  # ens192: VMXNET3 in the clone's first PCIe slot
    "labs-k8s:template.diskGib",
    "labs-k8s:template.firmware",
    "labs-k8s:template.retainOnDestroy",
    *(
        f"labs-k8s:nodes.{role}.{size}"
        for role in ("balancers", "controlPlanes", "workers")
        for size in ("vcpu", "memoryMib")
    ),
    "labs-k8s:nodes.controlPlanes.dataDiskGib",
    "labs-k8s:nodes.workers.dataDiskGib",
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
        return any(
            (leaf == full or leaf.startswith(f"{full}.")) and (not bare or leaf.rsplit(".", 1)[-1] in bare)
            for fulls, bare in rows
            for full in fulls
        )

    unlisted = [leaf for leaf in leaves if not listed(leaf) and leaf not in SAME_AT_EVERY_SITE]
    assert not unlisted, f'README "What to change for your site" does not say what these must be: {unlisted}'
    assert not [key for key in SAME_AT_EVERY_SITE if key not in leaves], "a key kept as it is, not in the example"
    assert not [key for key in SAME_AT_EVERY_SITE if listed(key)], "a key both listed and kept as it is"


# --------------------------------------------------------------------------- after `make up` (issue 24)


def test_the_readme_kubeconfig_is_private_and_outside_the_checkout(tmp_path):
    """The README wrote the cluster-admin kubeconfig into the checkout, world-readable and not
    ignored by git. Its lines, run verbatim with a umask of 022 and stand-ins for the two CLIs."""
    readme = (REPO_ROOT / "README.md").read_text()
    block = re.search(r"<!-- kubeconfig -->\n```sh\n(.*?)```", readme, flags=re.S).group(1)
    box = Sandbox(tmp_path, with_cli=False)
    (box.bin / "pulumi").write_text("#!/bin/sh\necho 'apiVersion: v1  # client-key-data: SECRET'\n")
    (box.bin / "kubectl").write_text('#!/bin/sh\necho "kubectl $*"\n')
    for tool in ("pulumi", "kubectl"):
        (box.bin / tool).chmod(0o755)
    before = set(box.repo.rglob("*"))
    result = box.run("umask 022\n" + block, STACK="mysite")
    assert result.returncode == 0, result.stderr
    written = box.home / ".kube" / "labs-k8s-mysite"
    assert "SECRET" in written.read_text()
    assert written.stat().st_mode & 0o777 == 0o600
    assert f"kubectl --kubeconfig {written} get nodes" in result.stdout
    assert set(box.repo.rglob("*")) == before  # nothing new in the checkout
    # The shell's own umask is left as it was for what the user runs next.
    after = box.run("umask 022\n" + block + "umask\n", STACK="mysite")
    assert after.stdout.strip().endswith("0022")


def test_the_datastore_size_in_the_prerequisites_is_what_preflight_asks_for():
    """The prerequisites' figure is preflight's own sum for the example (components/vsphere/preflight.py
    _check_datastore: eager-zeroed disks + swap files, plus the margin)."""
    from components.config import NAMESPACE, load_lab_config
    from components.preflight import preflight_spec
    from components.tools.offline import PLACEHOLDER_PUBLIC_KEY

    config = yaml.safe_load((REPO_ROOT / "Pulumi.labs.yaml").read_text())["config"]
    raw = {key[len(NAMESPACE) + 1 :]: value for key, value in config.items() if key.startswith(f"{NAMESPACE}:")}
    raw["ssh"] = {**raw["ssh"], "publicKey": PLACEHOLDER_PUBLIC_KEY}
    spec = preflight_spec(load_lab_config(raw), "labs")
    disks = sum(sum(vm.disk_gib) for vm in spec.vms)
    swap = sum(vm.memory_mib for vm in spec.vms) / 1024
    needed = round((disks + swap) * (1 + spec.free_space_margin))
    prerequisites = (REPO_ROOT / "README.md").read_text().split("## Prerequisites", 1)[1].split("\n## ", 1)[0]
    text = " ".join(prerequisites.split())
    assert f"about {needed} GiB free" in text
    assert f"{disks} GiB of disks" in text and f"{swap:.0f} GiB of VM swap files" in text
    assert f"{spec.free_space_margin:.0%} margin" in text.replace(" %", "%")


def _ca_section() -> str:
    runbook = (REPO_ROOT / "docs" / "runbook.md").read_text()
    return runbook.split("### Trusting the vCenter certificate", 1)[1].split("\n### ", 1)[0]


def test_the_ca_how_to_uses_only_what_step_one_installs(tmp_path):
    """`unzip` is not in README step 1: the how-to unpacks vCenter's download.zip with python3,
    and its extraction line, run on an archive laid out as vCenter's (certs/lin/<hash>.0,
    certs/mac/..., certs/win/...), yields the Linux CA files the next line copies."""
    import zipfile

    section = _ca_section()
    linux = re.findall(r"```sh\n(.*?)```", section, flags=re.S)[0]
    assert not [block for block in re.findall(r"```sh\n(.*?)```", section, flags=re.S) if "unzip" in block]
    extract = next(line for line in linux.splitlines() if "zipfile" in line)
    with zipfile.ZipFile(tmp_path / "vcenter-certs.zip", "w") as archive:
        for name in ("certs/lin/1a2b3c4d.0", "certs/lin/1a2b3c4d.r0", "certs/mac/1a2b3c4d.0", "certs/win/1a2b.crt"):
            archive.writestr(name, "-----BEGIN X509 CRL or CERTIFICATE-----\n")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", extract], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "certs" / "lin" / "1a2b3c4d.0").is_file()


def test_the_ca_how_to_gives_the_macos_path():
    """On macOS Go verifies against the Keychain and ignores SSL_CERT_FILE (crypto/x509
    root_darwin.go), while Python's ssl reads OpenSSL's files, never the Keychain: two steps."""
    section = _ca_section()
    assert "security add-trusted-cert" in section and "/Library/Keychains/System.keychain" in section
    assert "SSL_CERT_FILE" in section.split("On macOS", 1)[1]


@pytest.mark.parametrize("doc", ["README.md", "docs/runbook.md", "docs/drills.md", "docs/troubleshooting.md"])
def test_a_users_command_blocks_name_their_stack_not_the_example(doc):
    """Copied as they are, `--stack labs` lines act on the example stack, not the reader's site
    (docs/pull-requests.md describes the workflow's own `labs` stack and keeps it)."""
    hard_coded = [line for line in code_lines(REPO_ROOT / doc) if re.search(r"--stack labs\b", line)]
    assert not hard_coded, f'{doc}: use --stack "$STACK": {hard_coded}'


# --------------------------------------------------------------------------- docs/architecture.md's graph (issue 24)

# The shape diagram's boxes, as the resources of the committed stack each stands for.
SHAPE_GROUPS = {
    "T": r"golden-template",
    "CS": r".*-clone-source",
    "VM": r"labs-k8s-(lb|m|w)\d+",
    "AA": r".*-anti-affinity",
    "HK": r".*-host-key",
    "R": r".*-ready",
    "NS": r".*-node-settings",
    "LB": r".*-lb-setup",
    "P1": r"labs-k8s-m01-prepare",
    "P": r"labs-k8s-(m0[2-9]|w\d+)-prepare",
    "I": r"labs-k8s-m01-kubeadm-init",
    "L1": r"labs-k8s-m01-leave-cluster",
    "L2": r"labs-k8s-m02-leave-cluster",
    "L3": r"labs-k8s-m03-leave-cluster",
    "LW": r"labs-k8s-w\d+-leave-cluster",
    "F1": r"labs-k8s-m01-refresh-join-material",
    "F2": r"labs-k8s-m02-refresh-join-material",
    "F3": r"labs-k8s-m03-refresh-join-material",
    "FW": r"labs-k8s-w\d+-refresh-join-material",
    "J1": r"labs-k8s-m01-kubeadm-join",
    "J2": r"labs-k8s-m02-kubeadm-join",
    "J3": r"labs-k8s-m03-kubeadm-join",
    "JW": r"labs-k8s-w\d+-kubeadm-join",
    "U1": r"labs-k8s-m01-upgrade",
    "U2": r"labs-k8s-m02-upgrade",
    "U3": r"labs-k8s-m03-upgrade",
    "UD": r"labs-k8s-w\d+-upgrade-drain",
    "UW": r"labs-k8s-w\d+-upgrade",
    "UU": r"labs-k8s-w\d+-upgrade-uncordon",
    "TG": r"teardown-guard",
    "FL": r"flannel",
    "KC": r"kubeconfig",
    "V": r"verify-cluster",
}
# The generated secrets: the host key seeds (rendering/host_keys.py) and the triggers' HMAC key too.
NOT_DRAWN = {
    "bootstrap-token-id",
    "bootstrap-token-secret",
    "certificate-key",
    "secrets-encryption-key",
    "vrrp-password",
    "step-trigger-key",
    "control-plane-host-key-seed",
    *(f"labs-k8s-{n}-host-key-seed" for n in ("lb01", "lb02", "m01", "m02", "m03", "w01", "w02")),
    *(f"labs-k8s-{n}-join-token" for n in ("m01", "m02", "m03", "w01", "w02")),
    *(f"labs-k8s-{n}-certificate-key" for n in ("m01", "m02", "m03")),
}


def _architecture() -> str:
    return (REPO_ROOT / "docs" / "architecture.md").read_text()


def _shape_edges() -> list[tuple[str, str, str]]:
    """(source, target, label) of every arrow; a label such as `m01's` names the one member meant."""
    block = re.search(r"## The dependency graph.*?```mermaid\n(.*?)```", _architecture(), flags=re.S).group(1)
    edges = []
    for line in block.splitlines()[1:]:
        parts = [re.match(r"\s*(?:\|([^|]*)\|)?\s*([A-Z]\w*)", part).groups() for part in line.split("-->")]
        edges += [(a[1], b[1], b[0] or "") for a, b in itertools.pairwise(parts)]
    return edges


def test_the_architecture_diagram_draws_real_dependencies(offline_run):
    """It showed no upgrade steps and all five prepares gating init (only m01's does)."""
    custom = {reg.urn: reg for reg in offline_run.registrations.values() if reg.custom}
    names = {urn: reg.name for urn, reg in custom.items()}
    members = {box: {n for n in names.values() if re.fullmatch(pattern, n)} for box, pattern in SHAPE_GROUPS.items()}
    assert all(members.values()), [box for box, found in members.items() if not found]
    drawn = {n for found in members.values() for n in found}
    assert set(names.values()) - drawn == NOT_DRAWN, "a resource the diagram does not show"
    deps = {reg.name: {names[d] for d in reg.dependencies if d in names} for reg in custom.values()}
    edges = _shape_edges()
    assert {box for source, target, _ in edges for box in (source, target)} == set(SHAPE_GROUPS)
    for source, target, label in edges:
        for resource in members[target]:
            assert deps[resource] & members[source], f"{source} --> {target}: {resource} depends on no {source}"
        if len(members[target]) == 1:  # into one step from a group: every member gates it, or the one named
            (resource,) = members[target]
            meant = {m for m in members[source] if f"-{label.removesuffix(chr(39) + 's')}-" in m} if label else set()
            assert not label or len(meant) == 1, f"{source} -->|{label}| {target}: names no single member"
            gating = meant or members[source]
            assert gating <= deps[resource], f"{source} --> {target}: not all of {gating} gate {resource}"


def test_the_architecture_depth_is_the_programs(offline_run, run_with, lab_namespace):
    from components.tools.render import graph_depth

    depth = graph_depth(offline_run)
    stated = re.search(r"Its depth is (\d+) resources whatever the worker count", _architecture())
    assert stated and int(stated.group(1)) == depth
    workers = lab_namespace["nodes"]["workers"]["hosts"]
    workers += [{"name": f"labs-k8s-w{i:02}", "ip": f"10.3.60.{70 + i}"} for i in range(3, 11)]
    assert graph_depth(run_with(nodes=lab_namespace["nodes"])) == depth  # ten workers: the same


def test_the_secrets_table_names_every_secret_the_program_draws(offline_run):
    """issue 50: docs/cluster.md says of each secret where it lives and who can read it, in a table
    that names every random secret the program registers and every secret of the stack file."""
    from components.tools.offline import REQUIRED_SECRETS

    cluster = (REPO_ROOT / "docs" / "cluster.md").read_text()
    table = cluster.split("### Each secret, where it lives, who can read it", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `") or line.startswith("| the ")]
    names = " ".join(row.split("|")[1] for row in rows)
    for reg in offline_run.registrations.values():
        if reg.type.startswith("random:"):
            generic = re.sub(r"^labs-k8s-(?:lb|m|w)\d+-", "<node>-", reg.name)
            assert f"`{generic}`" in names, reg.name
    for key in REQUIRED_SECRETS:
        assert f"`{key}`" in names, key
    assert all(len(row.split("|")) == 6 for row in rows)
    runbook = (REPO_ROOT / "docs" / "runbook.md").read_text()
    assert "(cluster.md#each-secret-where-it-lives-who-can-read-it)" in runbook
