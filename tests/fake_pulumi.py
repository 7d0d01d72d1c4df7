"""A stand-in for the Pulumi CLI, for the first-install tests (tests/test_first_install.py).

Installed as `pulumi` on a test's PATH. It records every invocation (its argv and PULUMI_PARALLEL
only: secrets reach it through stdin, as the README says they must) in
$FAKE_PULUMI_HOME/calls.jsonl, and models what the first-install path depends on, after the
real CLI (pulumi/pulumi pkg/cmd/pulumi):

- `login [url|--local]`, `logout`, `whoami --json`: one current backend, as ~/.pulumi/credentials.json
  holds; PULUMI_BACKEND_URL wins, as it does for the real CLI. Pulumi Cloud in a non-interactive
  session needs PULUMI_ACCESS_TOKEN.
- `stack ls --json`, `stack init`, `stack select`: stacks per backend. On a self-managed backend the
  secrets provider is a passphrase (PULUMI_CONFIG_PASSPHRASE[_FILE]); `stack init` writes an
  `encryptionsalt:` line into the existing stack file and keeps its config, and a salt that is
  already there must match the passphrase ("incorrect passphrase", pulumi/pulumi#17759).
- `config set [--secret] [--path] KEY [VALUE]` (VALUE from stdin when absent) writes the stack file,
  secrets as `secure: v1:...` ciphertext (the plaintext is kept in this fake's own state, as the
  real key lives in the backend or the passphrase); `config get` prints a value.
- `config refresh [--force]`: writes the settings of the stack's last update, and its secrets
  provider (the passphrase salt), back into the stack file; an existing file is first renamed to
  `<file>.bak`; a stack that never ran an update has none ("no previous deployment"), as
  newConfigRefreshCmd and backend.GetLatestConfiguration do (pkg/cmd/pulumi/config).
- `stack export [--show-secrets]`, `stack import --file F`: the stack's deployment. `stack init`
  stores none: export prints `"deployment": null` (pkg/backend/diy/backend.go CreateStack,
  ExportDeployment); import refuses a resource of another stack (pkg/cmd/pulumi/stack/
  stack_import.go, SaveSnapshot). A secret is exported as apitype.SecretV1: ciphertext, or with
  --show-secrets its value as JSON in `plaintext`.
- `up`, `preview`: run the project's real program under Pulumi's mock engine
  (components.tools.offline.run_program) with the stack file's settings, the decrypted secrets and the
  stack's deployment as its previous state (None: no deployment, components.tools.offline.LabMocks), so
  every check the program makes before registering resources runs as under `pulumi up`; an error is
  printed and the exit status is 255, like the real CLI's; an engine panic (EnginePanic) exits 2,
  as a Go panic does. No provider is contacted. A successful `up` records the settings it ran with
  as the stack's last update, and its resources as the stack's deployment, with the default vSphere
  provider configured from the stack's `vsphere:*` settings (pkg/resource/deploy/target.go
  GetPackageConfig: the namespace stripped, strings, secrets kept secret).
- `destroy` (leaves a deployment without resources), `version`. With $FAKE_PULUMI_FAILS set, `up`
  and `destroy` fail with its text as the engine's error (status 255), as a failed step makes them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import yaml

STATE = Path(os.environ.get("FAKE_PULUMI_HOME", Path.home() / ".fake-pulumi"))
CLOUD = "https://api.pulumi.com"
SELF_MANAGED = ("file://", "s3://", "azblob://", "gs://", "postgres://")


def fail(message: str, status: int = 255) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def load(name: str, default: Any) -> Any:
    path = STATE / name
    return json.loads(path.read_text()) if path.is_file() else default


def save(name: str, value: Any) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / name).write_text(json.dumps(value, indent=1))


def record(argv: list[str]) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    with (STATE / "calls.jsonl").open("a") as log:
        log.write(json.dumps({"argv": argv, "cwd": os.getcwd(), "parallel": os.environ.get("PULUMI_PARALLEL")}) + "\n")


def backend() -> str | None:
    return os.environ.get("PULUMI_BACKEND_URL") or load("login.json", {}).get("url")


def require_backend() -> str:
    url = backend()
    if url is None:
        fail("PULUMI_ACCESS_TOKEN must be set for login during non-interactive CLI sessions")
    assert url is not None
    return url


def passphrase() -> str | None:
    if os.environ.get("PULUMI_CONFIG_PASSPHRASE"):
        return os.environ["PULUMI_CONFIG_PASSPHRASE"]
    if os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
        return Path(os.environ["PULUMI_CONFIG_PASSPHRASE_FILE"]).read_text().strip()
    return None


def salt_for(phrase: str) -> str:
    return "v1:fake:" + hashlib.sha256(phrase.encode()).hexdigest()[:24]


def stacks() -> dict[str, dict[str, Any]]:
    return load("stacks.json", {}).get(require_backend(), {})


def save_stacks(value: dict[str, dict[str, Any]]) -> None:
    everything = load("stacks.json", {})
    everything[require_backend()] = value
    save("stacks.json", everything)


def stack_path(stack: str) -> Path:
    return Path.cwd() / f"Pulumi.{stack}.yaml"


def read_document(stack: str) -> dict[str, Any]:
    path = stack_path(stack)
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def write_document(stack: str, document: dict[str, Any]) -> None:
    stack_path(stack).write_text(yaml.safe_dump(document, sort_keys=False))


def flags(argv: list[str]) -> tuple[list[str], dict[str, str | bool]]:
    """Positional arguments and --flags (values for --stack/-s, booleans otherwise)."""
    with_value = {
        "--stack": "stack",
        "-s": "stack",
        "--secrets-provider": "secrets-provider",
        "--cwd": "cwd",
        "-C": "cwd",
        "--file": "file",
    }
    positional: list[str] = []
    options: dict[str, str | bool] = {}
    items = iter(argv)
    for item in items:
        if item in with_value:
            options[with_value[item]] = next(items)
        elif item.startswith("--stack="):
            options["stack"] = item.split("=", 1)[1]
        elif item.startswith("-"):
            options[item.lstrip("-")] = True
        else:
            positional.append(item)
    return positional, options


def current_stack(options: dict[str, str | bool]) -> str:
    stack = options.get("stack") or load("selected.json", {}).get(backend() or "")
    if not isinstance(stack, str) or not stack:
        fail("no stack selected; please use `pulumi stack select`")
    assert isinstance(stack, str)
    if stack not in stacks():
        fail(f"no stack named '{stack}' found")
    return stack


def require_secrets_key(stack: str) -> None:
    if not require_backend().startswith(SELF_MANAGED):
        return
    phrase = passphrase()
    if phrase is None:
        fail(
            "getting secrets manager: passphrase must be set with PULUMI_CONFIG_PASSPHRASE or "
            "PULUMI_CONFIG_PASSPHRASE_FILE environment variables"
        )
    assert phrase is not None
    if read_document(stack).get("encryptionsalt") != salt_for(phrase):
        fail("incorrect passphrase")


def cmd_login(positional: list[str], options: dict[str, str | bool]) -> None:
    if options.get("local"):
        url = "file://~"
    elif positional:
        url = positional[0]
    else:
        if not os.environ.get("PULUMI_ACCESS_TOKEN"):
            fail("problem logging in: PULUMI_ACCESS_TOKEN must be set for login during non-interactive CLI sessions")
        url = CLOUD
    save("login.json", {"url": url, "user": os.environ.get("USER", "tester")})
    print(f"Logged in to {url}")


def cmd_whoami(options: dict[str, str | bool]) -> None:
    url = require_backend()
    user = "tester"
    if options.get("json"):
        print(json.dumps({"user": user, "organizations": [user], "url": url}))
    else:
        print(user)


def cmd_stack(positional: list[str], options: dict[str, str | bool]) -> None:
    sub = positional[0] if positional else "ls"
    existing = stacks()
    if sub == "ls":
        print(json.dumps([{"name": name, "current": False} for name in sorted(existing)]))
    elif sub == "init":
        name = positional[1]
        if name in existing:
            fail(f"stack '{name}' already exists")
        document = read_document(name)
        if require_backend().startswith(SELF_MANAGED):
            phrase = passphrase()
            if phrase is None:
                fail(
                    "passphrase must be set with PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE "
                    "environment variables"
                )
            assert phrase is not None
            if "encryptionsalt" in document and document["encryptionsalt"] != salt_for(phrase):
                fail("incorrect passphrase")
            document = {
                "encryptionsalt": salt_for(phrase),
                **{k: v for k, v in document.items() if k != "encryptionsalt"},
            }
        if document:
            write_document(name, document)
        existing[name] = {}
        save_stacks(existing)
        save("selected.json", {**load("selected.json", {}), require_backend(): name})
        print(f"Created stack '{name}'")
    elif sub == "export":
        name = current_stack(options)
        deployment = existing[name].get("deployment")
        if options.get("show-secrets"):
            require_secrets_key(name)
        print(json.dumps({"version": 3, "deployment": exported(deployment, bool(options.get("show-secrets")))}))
    elif sub == "import":
        name = current_stack(options)
        require_secrets_key(name)
        document = json.loads(Path(str(options["file"])).read_text())
        deployment = document.get("deployment") or {}
        for resource in deployment.get("resources") or []:
            if str(resource.get("urn", "")).split("::")[0] != f"urn:pulumi:{name}":
                fail(f"resource '{resource.get('urn')}' is from a different stack (use --force to import anyway)")
        existing[name]["deployment"] = deployment
        save_stacks(existing)
        print("Import complete.")
    elif sub == "select":
        name = positional[1] if len(positional) > 1 else str(options.get("stack"))
        if name not in existing:
            fail(f"no stack named '{name}' found")
        save("selected.json", {**load("selected.json", {}), require_backend(): name})
    else:
        fail(f"fake pulumi: `stack {sub}` is not modelled")


SECRET_SIG_KEY, SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"


def exported(value: Any, show_secrets: bool) -> Any:
    """The fake keeps a secret as {"secret": value}; export writes apitype.SecretV1."""
    if isinstance(value, dict) and set(value) == {"secret"}:
        if show_secrets:
            return {SECRET_SIG_KEY: SECRET_SIG, "plaintext": json.dumps(value["secret"])}
        return {
            SECRET_SIG_KEY: SECRET_SIG,
            "ciphertext": "v1:fake:" + hashlib.sha256(json.dumps(value["secret"]).encode()).hexdigest()[:16],
        }
    if isinstance(value, dict):
        return {k: exported(v, show_secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [exported(v, show_secrets) for v in value]
    return value


def default_vsphere_provider(stack: str, config: dict[str, Any], secret_keys: set[str]) -> dict[str, Any]:
    from components.tools.offline import default_provider_inputs

    inputs = {"version": "4.13.1", **default_provider_inputs(config, secret_keys)["vsphere"]}
    return {
        "urn": f"urn:pulumi:{stack}::labs-k8s::pulumi:providers:vsphere::default_4_13_1",
        "custom": True,
        "id": "fake-provider-id",
        "type": "pulumi:providers:vsphere",
        "inputs": inputs,
    }


def cmd_config(positional: list[str], options: dict[str, str | bool]) -> None:
    stack = current_stack(options)
    sub = positional[0] if positional else "ls"
    document = read_document(stack)
    config = document.setdefault("config", {})
    vault = load("secrets.json", {})
    if sub == "set":
        key = positional[1]
        value = positional[2] if len(positional) > 2 else sys.stdin.read()
        if len(positional) <= 2 and not options.get("secret"):
            value = value.rstrip("\n")
        if options.get("secret"):
            require_secrets_key(stack)
            cipher = "v1:" + base64.b64encode(secrets.token_bytes(24)).decode()
            vault[cipher] = value
            save("secrets.json", vault)
            stored: Any = {"secure": cipher}
        else:
            stored = value
        if options.get("path") and "." in key.split(":", 1)[1]:
            top, rest = key.split(".", 1)
            node = config.setdefault(top, {})
            *parents, leaf = rest.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = stored
        else:
            config[key] = stored
        write_document(stack, document)
    elif sub == "refresh":
        deployed = stacks()[stack].get("lastUpdate")
        if deployed is None:
            fail("no previous deployment")
        path = stack_path(stack)
        if path.is_file() and not options.get("force") and not options.get("f"):
            backup = Path(f"{path}.bak")
            while backup.exists():
                backup = Path(f"{backup}.bak")
            path.rename(backup)
            print(f"backed up existing configuration file to {backup}")
        write_document(stack, deployed)
        print(f"refreshed configuration for stack '{stack}'")
    elif sub == "get":
        value = config.get(positional[1])
        if value is None:
            fail(f"configuration key '{positional[1]}' not found for stack '{stack}'")
        print(vault[value["secure"]] if isinstance(value, dict) and "secure" in value else value)
    else:
        fail(f"fake pulumi: `config {sub}` is not modelled")


def secret_config_keys(stack: str) -> set[str]:
    return {
        key
        for key, value in (read_document(stack).get("config") or {}).items()
        if isinstance(value, dict) and set(value) == {"secure"}
    }


def decrypted_config(stack: str) -> dict[str, Any]:
    vault = load("secrets.json", {})
    config = dict(read_document(stack).get("config") or {})
    for key, value in list(config.items()):
        if isinstance(value, dict) and set(value) == {"secure"}:
            require_secrets_key(stack)
            if value["secure"] not in vault:
                fail(f"could not decrypt configuration value '{key}': cipher: message authentication failed")
            config[key] = vault[value["secure"]]
    return config


def agent_problem() -> str | None:
    """What every remote step of an `up` or `destroy` fails with when SSH_AUTH_SOCK names no live
    agent: pulumi-command (launched by the CLI with its environment) dials the agent whenever the
    variable is set, before any key is tried, and returns the dial's error (pulumi-command 1.2.1
    provider/pkg/provider/remote/connection.go `SShConfig`: net.Dial("unix", ...))."""
    path = os.environ.get("SSH_AUTH_SOCK", "")
    if not path:
        return None
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
        except OSError as error:
            return f"dial unix {path}: connect: {error.strerror.lower() if error.strerror else error}"
    return None


def cmd_run(command: str, options: dict[str, str | bool]) -> None:
    stack = current_stack(options)
    problem = agent_problem() if command in ("up", "destroy") else None
    if problem:
        fail(f"every command:remote:Command failed: {problem}")
    if os.environ.get("FAKE_PULUMI_FAILS") and command in ("up", "destroy"):
        # A test's failed step (the engine's error, status 255).
        fail(os.environ["FAKE_PULUMI_FAILS"])
    if command == "destroy":
        # What a destroy leaves: a deployment without resources.
        existing = stacks()
        if existing[stack].get("deployment") is not None:
            existing[stack]["deployment"] = {"manifest": {}, "resources": []}
            save_stacks(existing)
        print(f"Destroying (fake) stack {stack}\nResources:\n    0 deleted")
        return
    config = decrypted_config(stack)
    sys.path.insert(0, str(Path.cwd()))
    import pulumi

    from components.config import LabConfigError
    from components.tools.offline import EnginePanic, run_program

    deployment = stacks()[stack].get("deployment")
    previous = (
        None
        if deployment is None
        else {
            r["urn"]: {"type": r["type"], "outputs": r.get("outputs") or {}} for r in deployment.get("resources") or []
        }
    )
    organization = "organization" if require_backend().startswith(SELF_MANAGED) else "tester"
    try:
        run = run_program(
            stack, overrides=config, preview=command == "preview", previous=previous, organization=organization
        )
    except EnginePanic as panic:
        print(f"{panic}\n\ngoroutine 1 [running]: (fake pulumi)", file=sys.stderr)
        sys.exit(2)
    except (pulumi.RunError, LabConfigError) as error:
        print(f"{'Previewing update' if command == 'preview' else 'Updating'} ({stack})\n")
        fail(f"program failed:\n{error}")
    if command == "up":
        existing = stacks()
        existing[stack]["lastUpdate"] = read_document(stack)
        existing[stack]["deployment"] = {
            "manifest": {},
            "resources": [
                default_vsphere_provider(stack, config, secret_config_keys(stack)),
                *(
                    {"urn": urn, "type": entry["type"], "outputs": entry["outputs"]}
                    for urn, entry in run.previous_state().items()
                ),
            ],
        }
        save_stacks(existing)
    print(f"Resources:\n    + {len(run.registrations)} to create (fake {command}: recorded, nothing sent)")


def main(argv: list[str]) -> None:
    record(argv)
    positional, options = flags(argv)
    if not positional:
        fail("fake pulumi: no command")
    command, rest = positional[0], positional[1:]
    if command == "version":
        print(os.environ.get("FAKE_PULUMI_VERSION", "v3.272.0"))
    elif command == "login":
        cmd_login(rest, options)
    elif command == "logout":
        (STATE / "login.json").unlink(missing_ok=True)
    elif command == "whoami":
        cmd_whoami(options)
    elif command == "stack":
        require_backend()
        cmd_stack(rest, options)
    elif command == "config":
        require_backend()
        cmd_config(rest, options)
    elif command in ("up", "preview", "destroy"):
        require_backend()
        cmd_run(command, options)
    else:
        fail(f"fake pulumi: `{command}` is not modelled")


if __name__ == "__main__":
    main(sys.argv[1:])
