"""What `make up`, `make preview` and `make destroy` check before they hand over to the Pulumi CLI.

`python -m components check --stack <stack> --for up|preview|destroy`, in this order, each with
the command that fixes it:

1. the Pulumi CLI is installed (today's alternative: `pulumi: command not found`, exit 127), and
   new enough to hand the stack config to the template's provider (MINIMUM_CLI_VERSION); (up)
   `xorriso` is installed, which the template build needs after the ISO download;
2. it is logged in to a backend; the backend, the user and the stack are printed before anything
   happens, so nobody creates a stack in the wrong place;
3. the stack file `Pulumi.<stack>.yaml` exists: for a stack that exists, fetched with
   `pulumi config refresh` (stack files are not committed); for one that does not exist yet
   (up/preview), made from the example, and carrying no secrets from another stack (a copied
   `encryptionsalt` makes `stack init` fail with "incorrect passphrase"; copied ciphertext cannot
   be decrypted by the new stack's key);
4. the stack exists (destroy refuses to create one; up/preview create it with `pulumi stack init`);
   (destroy) the vCenter settings are the ones the last `up` recorded (recorded_login_changes);
5. (up/preview) the settings the program needs are set: the exact `pulumi config set` line for each
   missing one, and the lab config itself validated offline;
6. (up) a stack on a self-managed backend that has no deployment yet gets an initial one
   (initial_deployment): its stack resource's output tells the program, even after a first `up`
   that failed before any output, that the stack has a deployment (components/previous_state.py).

The stack file is read as a file, offline: secret values are ciphertext there and are checked by
the program itself, which sees them decrypted (components/stack_config.py).
"""

from __future__ import annotations

import difflib
import hmac
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from typing import Any

from components.config import NAMESPACE, LabConfigError, load_lab_config
from components.previous_state import INITIAL_DEPLOYMENT_OUTPUT
from components.stack_config import SSH_PRIVATE_KEY, provider_bool, unknown_vsphere_keys
from components.tools.offline import (
    PLACEHOLDER_PUBLIC_KEY,
    PROJECT,
    REPO_ROOT,
    StackFileError,
    read_stack_file,
    stack_file_path,
)

INSTALL_URL = "https://www.pulumi.com/docs/iac/download-install/"
# The first CLI that passes the whole stack config (vsphere:* included) to dynamic providers at
# Configure (pulumi/pulumi#17673); an older one leaves the template's provider without the login.
MINIMUM_CLI_VERSION = (3, 139, 0)
INSTALL_COMMAND = "curl -fsSL https://get.pulumi.com | sh"
CLI_TIMEOUT_S = 120
# Backends whose secrets provider defaults to a passphrase (everything but Pulumi Cloud).
SELF_MANAGED_SCHEMES = ("file://", "s3://", "azblob://", "gs://", "postgres://")
FOREIGN_SECRETS_KEYS = ("encryptionsalt", "encryptedkey", "secretsprovider")
# The tracked example every site's stack file starts from (README, "Your first lab", step 3).
EXAMPLE_STACK = "labs"
# Settings that must be ciphertext in the stack file. Pulumi's own guard only warns for key names that
# look secret (password, token, ...: pulumi/pulumi pkg/cmd/pulumi/config, looksLikeSecret), and a
# private key named sshPrivateKey passes it in clear.
MUST_BE_SECRET = {
    f"{NAMESPACE}:{SSH_PRIVATE_KEY}": "< ~/.ssh/labs-k8s",
    "vsphere:password": "",
}


class CheckFailed(Exception):
    """A problem with its fix; printed without a traceback."""


def _say(purpose: str, text: str) -> None:
    print(f"make {purpose}: {text}", flush=True)


def _pulumi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["pulumi", *args, "--non-interactive"], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
    )


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def require_cli(purpose: str) -> None:
    if shutil.which("pulumi") is None:
        raise CheckFailed(
            "the Pulumi CLI is not installed (no `pulumi` on PATH).\n"
            f"  Install it:  {INSTALL_COMMAND}\n"
            '               then open a new shell (or: export PATH="$HOME/.pulumi/bin:$PATH")\n'
            f"  Other ways:  {INSTALL_URL}\n"
            f'  Then log in (README, "Your first lab", step 2) and run `make {purpose}` again.'
        )


def cli_version(text: str) -> tuple[int, int, int] | None:
    """(3, 274, 1) from `pulumi version`'s "v3.274.1" (or "v3.274.1-dev.0"); None if unreadable."""
    match = re.match(r"v?(\d+)\.(\d+)\.(\d+)", text.strip())
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]))


def require_cli_version(purpose: str) -> None:
    result = subprocess.run(["pulumi", "version"], capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False)
    version = cli_version(result.stdout) if result.returncode == 0 else None
    needed = ".".join(map(str, MINIMUM_CLI_VERSION))
    if version is None:
        raise CheckFailed(
            f"`pulumi version` did not say which version it is ({_first_line(result.stdout + result.stderr)}); "
            f"this lab needs the Pulumi CLI {needed} or newer.\n  Reinstall it:  {INSTALL_COMMAND}"
        )
    if version < MINIMUM_CLI_VERSION:
        raise CheckFailed(
            f"the Pulumi CLI is {result.stdout.strip()}; this lab needs {needed} or newer (older ones do not hand "
            "the stack's vCenter settings to the template's provider, pulumi/pulumi#17673).\n"
            f"  Upgrade it:  {INSTALL_COMMAND}    (or your package manager's upgrade)\n"
            f"  Then run `make {purpose}` again."
        )


def require_xorriso(purpose: str) -> None:
    """The template build remasters the installer ISO with xorriso (components/iso.py), after a
    ~700 MB download: say it before anything is downloaded or created."""
    if shutil.which("xorriso") is None:
        raise CheckFailed(
            "xorriso is not installed; the golden template's build remasters the Debian installer ISO with it "
            "on this machine.\n"
            "  Debian/Ubuntu:  sudo apt-get install -y xorriso    macOS:  brew install xorriso\n"
            f"  Then run `make {purpose}` again."
        )


def whoami() -> dict[str, Any]:
    """The backend and user the CLI is logged in to, or CheckFailed saying how to log in."""
    result = _pulumi("whoami", "--json")
    if result.returncode != 0:
        raise CheckFailed(
            f"the Pulumi CLI is not logged in to a backend ({_first_line(result.stderr)}).\n"
            "  Log in to one of:\n"
            "    pulumi login                              # Pulumi Cloud (app.pulumi.com)\n"
            "    pulumi login s3://<bucket>/<prefix>       # self-managed: s3://, azblob://, gs://, file://<dir>\n"
            "    pulumi login --local                      # this machine only (~/.pulumi)\n"
            "  With a self-managed or local backend, also: export PULUMI_CONFIG_PASSPHRASE='<passphrase>'\n"
            '  (README, "Your first lab", step 2).'
        )
    try:
        info = json.loads(result.stdout or "{}")
    except json.JSONDecodeError:
        info = {"user": result.stdout.strip()}
    return info if isinstance(info, dict) else {}


def existing_stacks() -> set[str]:
    result = _pulumi("stack", "ls", "--json")
    if result.returncode != 0:
        raise CheckFailed(f"`pulumi stack ls` failed: {_first_line(result.stderr)}")
    try:
        rows = json.loads(result.stdout or "[]")
    except json.JSONDecodeError:
        raise CheckFailed("`pulumi stack ls --json` did not print JSON") from None
    # Pulumi Cloud names stacks org/project/stack or org/stack; the last part is what --stack takes here.
    return {str(row.get("name", "")).rsplit("/", 1)[-1] for row in rows if isinstance(row, dict)}


def stack_files_here() -> set[str]:
    """Stacks with a Pulumi.<stack>.yaml in this checkout."""
    return {path.name[len("Pulumi.") : -len(".yaml")] for path in REPO_ROOT.glob("Pulumi.*.yaml")}


def did_you_mean(stack: str, candidates: set[str]) -> str:
    """ " Did you mean 'mysite'?" for a near miss among the backend's stacks and this checkout's files."""
    near = difflib.get_close_matches(stack, sorted(candidates - {stack, EXAMPLE_STACK}), n=1, cutoff=0.6)
    return f"did you mean {near[0]!r} (STACK={near[0]})? " if near else ""


def _self_managed(url: str) -> bool:
    return url.startswith(SELF_MANAGED_SCHEMES)


def _has_passphrase() -> bool:
    return bool(os.environ.get("PULUMI_CONFIG_PASSPHRASE") or os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE"))


def _secure_keys(config: dict[str, Any]) -> list[str]:
    found = []
    for key, value in config.items():
        if isinstance(value, dict) and "secure" in value:
            found.append(key)
        elif isinstance(value, dict):
            found += [f"{key}.{inner}" for inner, v in value.items() if isinstance(v, dict) and "secure" in v]
    return found


def before_stack_init(stack: str, document: dict[str, Any], url: str) -> None:
    """A stack file about to meet a new stack must not carry another stack's secrets."""
    name = stack_file_path(stack).name
    foreign = [key for key in FOREIGN_SECRETS_KEYS if key in document]
    secure = _secure_keys(document.get("config") or {})
    if foreign or secure:
        lines = [
            f"{name} carries secrets material of another stack, but stack {stack!r} does not exist yet "
            "(was the file copied from another stack's?):"
        ]
        if foreign:
            lines.append(
                f"  - {', '.join(foreign)}: remove these lines; `pulumi stack init` writes this stack's own "
                '(a copied encryptionsalt fails with "incorrect passphrase")'
            )
        if secure:
            lines.append(
                f"  - secret values {', '.join(secure)}: remove them; they are ciphertext under the other "
                "stack's key. Set them again once the stack exists (the commands follow on the next run)"
            )
        raise CheckFailed("\n".join(lines))
    if _self_managed(url) and not _has_passphrase() and not sys.stdin.isatty():
        raise CheckFailed(
            f"backend {url} keeps secrets with a passphrase, and there is neither a terminal to ask for it nor "
            "PULUMI_CONFIG_PASSPHRASE / PULUMI_CONFIG_PASSPHRASE_FILE: export PULUMI_CONFIG_PASSPHRASE='<passphrase>' "
            "(keep it in your password manager: without it the stack's secrets cannot be read)"
        )


def settings_file_not_here(stack: str, url: str) -> str:
    """An existing stack without its Pulumi.<stack>.yaml here: a teammate's checkout, a new machine.

    Stack files are not committed (.gitignore), so a second person or machine has none. The
    example file would be wrong advice: its settings are not the lab's, and an `up` with them
    would change or replace the lab. The stack's last update recorded its settings and its
    secrets provider, and `pulumi config refresh` writes both back (pulumi/pulumi
    pkg/cmd/pulumi/config, newConfigRefreshCmd).
    """
    name = stack_file_path(stack).name
    return (
        f"stack {stack!r} exists in backend {url}, but its settings file {name} is not in this checkout "
        '(stack files are not committed: README, "Secrets and settings").\n'
        f"  Fetch the settings of its last update:  pulumi config refresh --stack {stack}\n"
        "  (or copy the file from whoever runs this lab). Not the example Pulumi.labs.yaml: its settings are "
        "not this lab's, and an update with them would change or replace the lab.\n"
        f"  A stack that never ran an update has nothing to fetch: cp Pulumi.labs.yaml {name}, edit it "
        '(README, "What to change for your site"), then set its secrets again.'
    )


def missing_settings(stack: str, document: dict[str, Any]) -> list[str]:
    """The exact `pulumi config set` commands for what the program needs and the stack file lacks."""
    config = document.get("config") or {}
    commands = []
    ssh = config.get(f"{NAMESPACE}:ssh") or {}
    if not (isinstance(ssh, dict) and ssh.get("publicKey")):
        commands.append(
            f"pulumi config set --stack {stack} --path '{NAMESPACE}:ssh.publicKey' \"$(cat ~/.ssh/labs-k8s.pub)\""
        )
    if f"{NAMESPACE}:{SSH_PRIVATE_KEY}" not in config:
        commands.append(f"pulumi config set --stack {stack} --secret {NAMESPACE}:{SSH_PRIVATE_KEY} < ~/.ssh/labs-k8s")
    for key, env, command in (
        ("vsphereServer", "VSPHERE_SERVER", f"pulumi config set --stack {stack} vsphere:vsphereServer <vcenter host>"),
        ("user", "VSPHERE_USER", f"pulumi config set --stack {stack} vsphere:user <user@vsphere.local>"),
        ("password", "VSPHERE_PASSWORD", f"pulumi config set --stack {stack} --secret vsphere:password"),
    ):
        if f"vsphere:{key}" not in config and not os.environ.get(env):
            commands.append(f"{command}    # or export {env}")
    return commands


def settings_problems(stack: str, document: dict[str, Any]) -> list[str]:
    """The lab config and the provider settings, validated offline (the program checks again, decrypted)."""
    config = document.get("config") or {}
    problems: list[str] = []
    raw = {
        key[len(NAMESPACE) + 1 :]: value
        for key, value in config.items()
        if key.startswith(f"{NAMESPACE}:") and key != f"{NAMESPACE}:{SSH_PRIVATE_KEY}"
    }
    ssh = raw.get("ssh", {})
    if isinstance(ssh, dict) and not ssh.get("publicKey"):
        raw["ssh"] = {**ssh, "publicKey": PLACEHOLDER_PUBLIC_KEY}  # reported with its command instead
    try:
        load_lab_config(raw)
    except LabConfigError as error:
        problems += [str(p) for p in error.problems]
    problems += unknown_vsphere_keys(config)
    for key, source in MUST_BE_SECRET.items():
        if key in config and not (isinstance(config[key], dict) and "secure" in config[key]):
            # Said without the value: it is in clear in the file, and must not reach a terminal or a log too.
            problems.append(
                f"{key} is set in clear in {stack_file_path(stack).name} (set without --secret); set "
                f"it again as a secret, which replaces the clear value: pulumi config set --stack {stack} "
                f"--secret {key}{' ' + source if source else ''}"
            )
    insecure = config.get("vsphere:allowUnverifiedSsl")
    try:
        # YAML reads a bare false as a boolean; Pulumi hands it to the program as "false".
        provider_bool(str(insecure).lower() if isinstance(insecure, bool) else insecure)
    except ValueError as error:
        problems.append(
            f"vsphere:allowUnverifiedSsl: {error}; write true or false: "
            f"pulumi config set --stack {stack} vsphere:allowUnverifiedSsl false"
        )
    return problems


def initial_deployment(stack: str, now: datetime | None = None) -> dict[str, Any]:
    """A deployment with only the root stack resource, carrying INITIAL_DEPLOYMENT_OUTPUT.

    `pulumi stack import` of this gives a self-managed stack a deployment: without one,
    readStackResourceOutputs crashes the CLI (pkg/backend/backend.go GetStackResourceOutputs,
    components/previous_state.py). The manifest has no version, so no magic cookie is checked
    (pkg/resource/deploy/manifest.go NewMagic, snapshot.go VerifyIntegrity). The engine keeps the
    stack resource's outputs until the program registers its own (a `same` step), so the output
    survives a first `up` that fails before any.
    """
    name = stack.rsplit("/", 1)[-1]
    return {
        "version": 3,
        "deployment": {
            "manifest": {"time": (now or datetime.now(UTC)).isoformat(), "magic": "", "version": ""},
            "resources": [
                {
                    "urn": f"urn:pulumi:{name}::{PROJECT}::pulumi:pulumi:Stack::{PROJECT}-{name}",
                    "custom": False,
                    "type": "pulumi:pulumi:Stack",
                    "outputs": {INITIAL_DEPLOYMENT_OUTPUT: "make up (components/tools/first_run.py)"},
                }
            ],
        },
    }


def give_initial_deployment(stack: str, purpose: str) -> None:
    """Idempotent: only a stack whose `pulumi stack export` shows no deployment (`null`, what
    diy/backend.go ExportDeployment prints for a stack `stack init` made) or one without any
    resource (what a `pulumi destroy` leaves) gets one; nothing is lost by replacing either."""
    exported = _pulumi("stack", "export", "--stack", stack)
    if exported.returncode != 0:
        raise CheckFailed(f"`pulumi stack export --stack {stack}` failed: {_first_line(exported.stderr)}")
    try:
        deployment = json.loads(exported.stdout or "{}").get("deployment")
    except (json.JSONDecodeError, AttributeError):
        raise CheckFailed(f"`pulumi stack export --stack {stack}` did not print a deployment") from None
    if deployment is not None and (not isinstance(deployment, dict) or deployment.get("resources")):
        return
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="labs-k8s-initial-") as file:
        json.dump(initial_deployment(stack), file)
        file.flush()
        imported = _pulumi("stack", "import", "--stack", stack, "--file", file.name)
    if imported.returncode != 0:
        raise CheckFailed(
            f"`pulumi stack import --stack {stack}` of its initial deployment failed: {_first_line(imported.stderr)}"
        )
    _say(
        purpose,
        f"gave stack {stack!r} its initial deployment (no resources): the program reads its previous "
        'state from it (docs/cluster.md, "The previous state")',
    )


VSPHERE_PROVIDER_TYPE = "pulumi:providers:vsphere"
# The settings both providers that log in to vCenter take from the stack config.
LOGIN_KEYS = ("vsphereServer", "user", "password", "allowUnverifiedSsl")
# How a secret is written in an exported deployment (pulumi/pulumi sdk/go/common/apitype SecretV1,
# sig.Secret); with --show-secrets its `plaintext` is the value as JSON (resource/stack/deployment.go).
SECRET_SIG_KEY = "4dabf18193072939515e22adb298388d"


def _setting_text(value: Any) -> str | None:
    """A setting as the engine hands it to a provider (config values are strings), for comparing."""
    if isinstance(value, dict) and SECRET_SIG_KEY in value:
        value = json.loads(value["plaintext"]) if "plaintext" in value else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return None if value is None else str(value)


def recorded_provider_inputs(stack: str) -> dict[str, Any] | None:
    """The inputs the default vSphere provider was configured with at the last `up`, from the
    state (None: the state has no such provider). Read with --show-secrets, kept in memory only."""
    exported = _pulumi("stack", "export", "--stack", stack, "--show-secrets")
    if exported.returncode != 0:
        raise CheckFailed(f"`pulumi stack export --stack {stack}` failed: {_first_line(exported.stderr)}")
    try:
        deployment = json.loads(exported.stdout or "{}").get("deployment") or {}
    except (json.JSONDecodeError, AttributeError):
        raise CheckFailed(f"`pulumi stack export --stack {stack}` did not print a deployment") from None
    for resource in deployment.get("resources") or []:
        urn = str(resource.get("urn", ""))
        if (
            resource.get("type") == VSPHERE_PROVIDER_TYPE
            and urn.rsplit("::", 1)[-1].startswith("default")
            and not resource.get("delete")
        ):
            return dict(resource.get("inputs") or {})
    return None


def recorded_login_changes(stack: str, document: dict[str, Any]) -> list[str]:
    """The `vsphere:*` settings whose stack value differs from what the last `up` recorded.

    `pulumi destroy` and `pulumi refresh` do not run the program: the engine configures each
    provider of the state, the vSphere provider's and the template's dynamic provider, with the
    inputs recorded at the last `up` (pulumi/pulumi pkg/resource/deploy/providers/registry.go
    Registry.Same: Configure with res.Inputs; #18740, which used the current config, was reverted
    by #18756). A changed login there means the old one. Secret values are compared in memory
    and never printed.
    """
    recorded = recorded_provider_inputs(stack)
    if recorded is None:
        return []  # no vSphere resource was ever created: nothing there logs in
    config = document.get("config") or {}
    changed = []
    for key in LOGIN_KEYS:
        current = config.get(f"vsphere:{key}")
        if isinstance(current, dict) and "secure" in current:
            shown = _pulumi("config", "get", "--stack", stack, f"vsphere:{key}")
            if shown.returncode != 0:
                raise CheckFailed(
                    f"`pulumi config get --stack {stack} vsphere:{key}` failed: {_first_line(shown.stderr)}"
                )
            current = shown.stdout.removesuffix("\n")
        now, then = _setting_text(current), _setting_text(recorded.get(key))
        if now is None or then is None:
            if now != then:
                changed.append(f"vsphere:{key}")
        elif not hmac.compare_digest(now.encode(), then.encode()):
            changed.append(f"vsphere:{key}")
    return changed


def check(stack: str, purpose: str) -> int:
    try:
        run_checks(stack, purpose)
    except CheckFailed as failure:
        print(f"make {purpose}: {failure}", file=sys.stderr, flush=True)
        return 2
    return 0


def run_checks(stack: str, purpose: str) -> None:
    require_cli(purpose)
    require_cli_version(purpose)
    if purpose == "up":
        require_xorriso(purpose)
    identity = whoami()
    url = str(identity.get("url") or identity.get("backendUrl") or "(unknown backend)")
    user = str(identity.get("user") or "(unknown user)")
    document: dict[str, Any] = {}
    stacks = existing_stacks()
    exists = stack.rsplit("/", 1)[-1] in stacks  # Pulumi Cloud also takes org/stack and org/project/stack
    if exists and not stack_file_path(stack).is_file():
        # destroy too: the template's provider reads the vCenter login from the stack's settings.
        raise CheckFailed(settings_file_not_here(stack, url))
    if not exists and stack == EXAMPLE_STACK and purpose != "destroy":
        # `stack init` writes this backend's encryptionsalt into the tracked example, and the
        # `config set --secret` lines that follow would write ciphertext there (README, "Secrets and settings").
        raise CheckFailed(
            f"stack {EXAMPLE_STACK!r} is the example every site's stack file starts from (Pulumi.labs.yaml is "
            f"committed): it is not created here, so that the example never carries a salt or ciphertext. "
            f'Make your site\'s stack (README, "Your first lab", step 3):\n'
            f'    export STACK=<site>\n    cp Pulumi.labs.yaml "Pulumi.$STACK.yaml"\n    pulumi stack init "$STACK"'
        )
    if purpose != "destroy":
        try:
            document = read_stack_file(stack)
        except StackFileError as error:
            # A typo is told so first, not to create a new stack from the example.
            maybe = "" if exists else did_you_mean(stack, stacks | stack_files_here())
            raise CheckFailed(f"{maybe}{'If not: ' if maybe else ''}{error}") from None
    if not exists:
        known = ", ".join(sorted(stacks)) or "none"
        if purpose == "destroy":
            raise CheckFailed(
                f"stack {stack!r} does not exist in backend {url} (logged in as {user}); nothing to destroy here. "
                f"{did_you_mean(stack, stacks)}Stacks there: {known}. Another backend? `pulumi login <url>`; "
                "another stack? `make destroy STACK=<name>`"
            )
        before_stack_init(stack, document, url)
        _say(purpose, f"creating stack {stack!r} in backend {url} as {user} (stacks there: {known})")
        created = subprocess.run(["pulumi", "stack", "init", stack], cwd=REPO_ROOT, timeout=CLI_TIMEOUT_S, check=False)
        if created.returncode != 0:
            raise CheckFailed(f"`pulumi stack init {stack}` failed (exit {created.returncode}); see its message above")
        document = read_stack_file(stack)
    else:
        _say(purpose, f"stack {stack!r} in backend {url} as {user}")
    if purpose == "destroy":
        settings = read_stack_file(stack)
        # Settings from Pulumi ESC environments are not in the file to compare.
        changed = [] if "environment" in settings else recorded_login_changes(stack, settings)
        if changed:
            raise CheckFailed(
                f"{', '.join(changed)} changed since the last `up` of stack {stack!r} (values not shown). "
                "`pulumi destroy` does not run the program: it configures the vSphere provider and the "
                "template's provider with the settings recorded at the last `up` (pulumi/pulumi#18756), so it "
                "would log in with the old ones.\n"
                f"  First:  make up STACK={stack}    (a changed login alone changes no resource)\n"
                f"  Then:   make destroy STACK={stack}"
            )
        return
    if "environment" in document:
        _say(
            purpose,
            f"{stack_file_path(stack).name} imports Pulumi ESC environments: settings are checked by the "
            "program itself, not here",
        )
    else:
        settings_complete(stack, document)
    if purpose == "up" and _self_managed(url):
        give_initial_deployment(stack, purpose)


def settings_complete(stack: str, document: dict[str, Any]) -> None:
    commands = missing_settings(stack, document)
    problems = settings_problems(stack, document)
    if commands or problems:
        lines = []
        if commands:
            lines.append(f'stack {stack!r} is missing settings the lab needs. Set them (README, "Your first lab"):')
            lines += [f"    {c}" for c in commands]
            if stack == EXAMPLE_STACK:
                lines.append(
                    "  These write into the committed example Pulumi.labs.yaml: only in a throw-away checkout "
                    "(as .github/workflows/preview.yml does), never committed; a site uses its own stack "
                    '(README, "Your first lab", step 3)'
                )
        if problems:
            lines.append(f"{stack_file_path(stack).name} has {len(problems)} problem(s); nothing was created:")
            lines += [f"  - {p}" for p in problems]
        raise CheckFailed("\n".join(lines))
