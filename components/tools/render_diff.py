"""`python -m components diff --stack STACK --against REF`: what a change does, machine by machine.

The stack is rendered twice, offline, as `render` does: once at REF and once from the working
tree. Each side is a clean temporary copy of its own code and config (`git archive` of REF; the
working tree's tracked and unignored files) rendered by its own code in a subprocess, with an
interpreter whose installed packages match that side's requirements.txt. Nothing talks to vCenter
or to the network (except pip, when a side pins other packages than this interpreter has).
A site's stack file is not in git (.gitignore): both sides then render the working tree's copy
(or the file `--stack-file` names), so the diff is what the code change does to that site.

The report has a resource summary and a unified diff of every rendered file, per host. The
summary is components.tools.changes (the model the runbook's change table comes from) applied to the
runs both sides recorded, run by this process (the working tree's code). Secrets stay `[secret]`:
the files' generated-secret placeholders are shown as `[secret]`, and resources' secret inputs are
compared through HMACs under a key made for this run and never written out.
It exits 0 whether or not anything changed; 2 when a side cannot be rendered.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import io
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.tools import changes
from components.tools.artifacts import SECRET_PLACEHOLDERS
from components.tools.offline import SECRET_MARK, OfflineRun, Registration, run_from_document

REPORT_FORMAT = 1
WORKING_TREE = "working tree"
RENDER_TIMEOUT_SECONDS = 900
# Where a side's own virtualenv goes when its pins differ from this interpreter's packages.
VENV_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "labs-k8s" / "diff-venvs"
# Settings from the caller's shell that must not reach a render: they would change what it reads.
_ENV_PREFIXES = ("PULUMI_", "VSPHERE_", "PYTHON")


class DiffError(Exception):
    """A side could not be checked out or rendered; the message says which and why."""


@dataclass
class Side:
    """One of the two things compared: a commit, or the working tree."""

    label: str  # "base" or "head"
    ref: str  # what the user named: a git ref, or WORKING_TREE
    commit: str  # the commit (for the working tree: HEAD)
    uncommitted: bool = False  # working tree only: it differs from HEAD
    stack_file: bool = True  # Pulumi.<stack>.yaml exists on this side

    @property
    def title(self) -> str:
        if self.ref == WORKING_TREE:
            return f"{WORKING_TREE} at {self.commit[:12]}" + (", with uncommitted changes" if self.uncommitted else "")
        short = self.commit[:12]
        return short if self.ref in (self.commit, short) else f"{self.ref} ({short})"


@dataclass
class FileChange:
    host: str  # a folder of the render's hosts/: a machine, or golden-template (the install media)
    path: str  # relative to the host's folder
    status: str  # added, removed or modified
    diff: str  # unified diff, secrets shown as [secret]


@dataclass
class ResourceChange:
    """One resource's effect, as components.tools.changes computes it from the two runs."""

    step: int  # when, in the order pulumi up runs them
    kind: str  # what happens at that step: "update", "replace", "update, power-cycles", ...
    action: str  # create, update, replace or delete
    name: str
    type: str
    type_label: str  # "VM", "step", ... as the runbook's change table says
    inputs: list[str]  # top-level inputs that change; for a replacement, those that force it first
    secret_inputs: list[str]  # those of `inputs` whose value is secret: shown as [secret]
    cause: str  # "inputs", or "replaced: <name>" when only a replaced dependency's outputs changed


@dataclass
class Report:
    stack: str
    base: Side
    head: Side
    files: list[FileChange] = field(default_factory=list)
    # None when a side's code cannot record its run (older than `render --fingerprint-key`).
    resources: list[ResourceChange] | None = field(default_factory=list)
    error: str = ""
    # The one stack file both sides rendered when git does not track it ("": each side's own).
    stack_file: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.files or self.resources)

    def counts(self) -> dict[str, int]:
        counts = {"create": 0, "update": 0, "replace": 0, "delete": 0}
        for change in self.resources or []:
            counts[change.action] += 1
        return counts

    def document(self) -> dict[str, Any]:
        """The JSON form (`--json`): what the pull-request comment is built from."""
        return {
            "format": REPORT_FORMAT,
            "stack": self.stack,
            "base": {**asdict(self.base), "title": self.base.title},
            "head": {**asdict(self.head), "title": self.head.title},
            "changed": self.changed,
            "error": self.error,
            "stack_file": self.stack_file,
            "resources": None if self.resources is None else [asdict(r) for r in self.resources],
            "files": [asdict(f) for f in self.files],
        }


# --------------------------------------------------------------------------- checkouts


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DiffError(f"git {' '.join(args)}: {proc.stderr.strip() or f'exit status {proc.returncode}'}")
    return proc.stdout


def repository_root(start: Path) -> Path:
    try:
        return Path(_git(start, "rev-parse", "--show-toplevel").strip())
    except DiffError:
        raise DiffError(f"{start} is not inside a git repository: diff compares git revisions") from None


def resolve_commit(repo: Path, ref: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise DiffError(f"--against {ref}: no such commit in {repo} (fetch it first, e.g. `git fetch origin main`)")
    return proc.stdout.strip()


def export_commit(repo: Path, commit: str, dest: Path) -> None:
    """The commit's tree, as `git archive` gives it: no .git, nothing untracked."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise DiffError(f"git archive {commit}: {archive.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")


def export_working_tree(repo: Path, dest: Path) -> bool:
    """Tracked and untracked-but-not-ignored files as they are on disk (no .venv, .cache or render/
    output). Returns whether the working tree differs from HEAD."""
    listed = _git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for relative in sorted(set(filter(None, listed.split("\0")))):
        source = repo / relative
        target = dest / relative
        if source.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.readlink(source))
        elif source.is_file():  # a deleted file is listed until the deletion is committed
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return bool(_git(repo, "status", "--porcelain", "--untracked-files=normal").strip())


# --------------------------------------------------------------------------- interpreters

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pin_mismatches(requirements: str) -> list[str]:
    """`name==version` pins of a requirements file that this interpreter's packages do not meet."""
    installed = {_normalized(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    mismatches = []
    for name, version in _PIN.findall(requirements):
        have = installed.get(_normalized(name))
        if have != version:
            mismatches.append(f"{name}=={version} (here: {have or 'not installed'})")
    return mismatches


def side_python(checkout: Path, label: str) -> str:
    """An interpreter for this side's code: this one when it has the side's pinned packages,
    else a virtualenv made once from the side's requirements.txt (hashes required, as `make venv`)."""
    requirements = checkout / "requirements.txt"
    if not requirements.is_file():
        return sys.executable
    mismatches = pin_mismatches(requirements.read_text())
    if not mismatches:
        return sys.executable
    venv = VENV_CACHE / hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    python = venv / "bin" / "python"
    if (venv / ".complete").is_file():
        return str(python)
    print(
        f"diff: the {label} pins other packages than this interpreter has ({'; '.join(mismatches[:3])}"
        f"{'; ...' if len(mismatches) > 3 else ''}): installing them into {venv}",
        file=sys.stderr,
    )
    shutil.rmtree(venv, ignore_errors=True)
    pip_env = {**os.environ, "PIP_CONFIG_FILE": "/dev/null", "PIP_FIND_LINKS": ""}
    for command in (
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--require-hashes", "-r", str(requirements)],
    ):
        proc = subprocess.run(command, env=pip_env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise DiffError(f"the {label}'s requirements.txt does not install: {proc.stderr.strip()[-2000:]}")
    (venv / ".complete").touch()
    return str(python)


# --------------------------------------------------------------------------- rendering


def _render_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIXES)}


def render_side(side: Side, checkout: Path, stack: str, out: Path, key_file: Path) -> None:
    """Run the side's own `python -m components render` in its checkout."""
    if not (checkout / f"Pulumi.{stack}.yaml").is_file():
        side.stack_file = False  # the stack is new (or gone) on this side: nothing renders
        return
    command = [side_python(checkout, side.label), "-m", "components", "render", "--stack", stack, "--out", str(out)]
    proc = subprocess.run(
        [*command, "--fingerprint-key", str(key_file)],
        cwd=checkout,
        env=_render_env(),
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT_SECONDS,
        check=False,
    )
    if proc.returncode == 2 and "unrecognized arguments: --fingerprint-key" in proc.stderr:
        # Older code renders files but cannot fingerprint secrets for the resource summary.
        proc = subprocess.run(
            command,
            cwd=checkout,
            env=_render_env(),
            capture_output=True,
            text=True,
            timeout=RENDER_TIMEOUT_SECONDS,
            check=False,
        )
    if proc.returncode != 0:
        detail = proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}"
        raise DiffError(f"the {side.label} ({side.title}) does not render:\n{detail[-4000:]}")


def rendered_files(render_dir: Path) -> dict[tuple[str, str], str]:
    hosts = render_dir / "hosts"
    if not hosts.is_dir():
        return {}
    return {
        (
            path.relative_to(hosts).parts[0],
            str(path.relative_to(hosts / path.relative_to(hosts).parts[0])),
        ): path.read_text()
        for path in sorted(hosts.rglob("*"))
        if path.is_file()
    }


_SECRET_VALUES = re.compile(
    # Whole values only: the certificate key's zeros also occur inside the (public) CA hash.
    r"(?<![\w:])("
    + "|".join(re.escape(v) for v in sorted(SECRET_PLACEHOLDERS.values(), key=len, reverse=True))
    + r")(?!\w)"
)


def redact(text: str) -> str:
    """The file as a reviewer may see it: generated-secret placeholders become [secret]."""
    return _SECRET_VALUES.sub(SECRET_MARK, text)


def unified_diff(before: str | None, after: str | None, name: str) -> str:
    """git-style: a/ and b/ prefixes, /dev/null for a file that is added or removed."""
    old = (before or "").splitlines(keepends=True)
    new = (after or "").splitlines(keepends=True)
    lines = difflib.unified_diff(
        old, new, f"a/{name}" if before is not None else "/dev/null", f"b/{name}" if after is not None else "/dev/null"
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def file_changes(before: dict[tuple[str, str], str], after: dict[tuple[str, str], str]) -> list[FileChange]:
    changes = []
    for host, path in sorted(set(before) | set(after)):
        old, new = before.get((host, path)), after.get((host, path))
        old = None if old is None else redact(old)
        new = None if new is None else redact(new)
        if old == new:
            continue
        status = "added" if old is None else "removed" if new is None else "modified"
        changes.append(FileChange(host, path, status, unified_diff(old, new, f"{host}/{path}")))
    return changes


def _secret_inputs(registration: Registration | None, names: Iterable[str]) -> list[str]:
    if registration is None:
        return []
    return [n for n in names if SECRET_MARK in json.dumps(registration.inputs.get(n))]


def resource_changes(base_render: Path, head_render: Path, base: Side, head: Side) -> list[ResourceChange] | None:
    """Each resource's effect, from the runs both sides recorded (components.tools.changes decides it)."""
    runs = []
    for side, render_dir in ((base, base_render), (head, head_render)):
        if not side.stack_file:
            runs.append(OfflineRun({}, {}, []))
            continue
        document = render_dir / "run.json"
        if not document.is_file():
            return None
        runs.append(run_from_document(json.loads(document.read_text())))
    before, after = runs
    plan = changes.plan_changes(before, after)
    when: dict[str, tuple[int, str]] = {}
    for step in plan.steps:  # a create-before-delete replacement is in two steps: its first one says it
        for name in step.names:
            when.setdefault(name, (step.order, step.kind))
    result = []
    for effect in plan.effects:
        registration = (after if effect.action != "delete" else before).registrations.get(effect.urn)
        order, kind = when.get(effect.name, (0, effect.action))
        label = changes._SHORT_TYPES.get(effect.type, effect.type)  # the runbook table's words
        result.append(
            ResourceChange(
                order,
                kind,
                effect.action,
                effect.name,
                effect.type,
                label,
                list(effect.inputs),
                _secret_inputs(registration, effect.inputs),
                effect.cause,
            )
        )
    return result


# --------------------------------------------------------------------------- the command


def site_stack_file(repo: Path, stack: str, given: Path | None) -> Path | None:
    """The stack file both sides render when git does not hold it: the path given, or the working
    tree's Pulumi.<stack>.yaml when git does not track it (.gitignore ignores every site's stack
    file, README "Secrets and settings"). None: the stack file is tracked, each side has its own."""
    if given is not None:
        if not given.is_file():
            raise DiffError(f"--stack-file {given}: no such file")
        return given
    in_tree = repo / f"Pulumi.{stack}.yaml"
    if in_tree.is_file() and not _git(repo, "ls-files", "--", in_tree.name).strip():
        return in_tree
    return None


def compare(repo: Path, stack: str, against: str, workdir: Path, stack_file: Path | None = None) -> Report:
    base = Side("base", against, resolve_commit(repo, against))
    head = Side("head", WORKING_TREE, _git(repo, "rev-parse", "--verify", "HEAD").strip())
    report = Report(stack, base, head)
    # A site's stack file is not in git: both sides render the same one, so the diff is the code's.
    shared_stack_file = site_stack_file(repo, stack, stack_file)
    if shared_stack_file is not None:
        inside = shared_stack_file.is_relative_to(repo)
        report.stack_file = str(shared_stack_file.relative_to(repo) if inside else shared_stack_file)
    key_file = workdir / "fingerprint.key"
    key_file.write_bytes(secrets.token_bytes(32))
    key_file.chmod(0o600)
    renders = {side.label: workdir / side.label / "render" for side in (base, head)}
    try:
        for side in (base, head):
            checkout = workdir / side.label / "checkout"
            checkout.mkdir(parents=True)
            if side is base:
                export_commit(repo, base.commit, checkout)
            else:
                side.uncommitted = export_working_tree(repo, checkout)
            if shared_stack_file is not None:
                shutil.copy2(shared_stack_file, checkout / f"Pulumi.{stack}.yaml")
            render_side(side, checkout, stack, renders[side.label], key_file)
        if not base.stack_file and not head.stack_file:
            raise DiffError(f"Pulumi.{stack}.yaml exists neither at {base.title} nor in the {WORKING_TREE}")
    except DiffError as error:
        report.error = str(error)
    except subprocess.TimeoutExpired as error:
        report.error = f"a render took longer than {error.timeout:.0f} s"
    else:
        report.files = file_changes(rendered_files(renders["base"]), rendered_files(renders["head"]))
        report.resources = resource_changes(renders["base"], renders["head"], base, head)
    return report


_ACTION_WORDS = {"create": "to create", "update": "to update", "replace": "to replace", "delete": "to delete"}


def resource_summary(report: Report) -> str:
    """ "2 to replace, 1 to update" (or why there is no summary)."""
    if report.resources is None:
        return "not compared: a side's code cannot record its run (it predates `render --fingerprint-key`)"
    counts = report.counts()
    return (
        ", ".join(f"{counts[a]} {_ACTION_WORDS[a]}" for a in ("create", "replace", "update", "delete") if counts[a])
        or "no change"
    )


def _inputs_text(change: ResourceChange) -> str:
    return ", ".join(f"{i} [secret]" if i in change.secret_inputs else i for i in change.inputs)


def report_text(report: Report) -> str:
    """What the command prints: one line when nothing changed, else the summary and the diffs."""
    header = f"stack {report.stack}: {report.base.title} -> {report.head.title}"
    if report.stack_file:
        header += f" (both with {report.stack_file}, which git does not track)"
    if report.error:
        return f"{header}\ncannot compare: {report.error}\n"
    if not report.changed:
        detail = "any resource or rendered file" if report.resources is not None else "any rendered file"
        return f"{header}: no change to {detail}\n"
    lines = [header, ""]
    for side in (report.base, report.head):
        if not side.stack_file:
            lines.append(f"Pulumi.{report.stack}.yaml does not exist at the {side.label}: it renders nothing")
    lines.append(f"Resources: {resource_summary(report)}")
    if report.resources:
        lines.append("  (in the order pulumi up runs them; `because` is a dependency that is replaced)")
        name_width = max(len(r.name) for r in report.resources)
        kind_width = max(len(r.kind) for r in report.resources)
        for change in report.resources:
            because = f"  because {change.cause}" if change.cause != "inputs" else ""
            lines.append(
                f"  {change.step:>2}  {change.kind:<{kind_width}}  {change.name:<{name_width}}  "
                f"{_inputs_text(change)}{because}".rstrip()
            )
    lines.append("")
    if not report.files:
        lines.append("Files: no rendered file changes")
        return "\n".join(lines) + "\n"
    hosts = sorted({f.host for f in report.files})
    lines.append(
        f"Files: {len(report.files)} changed on {len(hosts)} "
        f"{'host' if len(hosts) == 1 else 'hosts'} (a = {report.base.label}, b = {report.head.label})"
    )
    width = max(len(h) for h in hosts)
    lines += [f"  {f.host:<{width}}  {f.status:<8}  {f.path}" for f in report.files]
    lines.append("")
    return "\n".join(lines) + "\n" + "".join(f.diff for f in report.files)


def diff(
    stack: str,
    against: str,
    json_out: Path | None = None,
    repo: Path | None = None,
    stack_file: Path | None = None,
) -> int:
    try:
        root = repository_root(Path.cwd() if repo is None else repo)
        with tempfile.TemporaryDirectory(prefix="labs-k8s-diff-") as scratch:
            report = compare(root, stack, against, Path(scratch), None if stack_file is None else stack_file.resolve())
    except DiffError as error:  # nothing to compare: the ref or the repository is wrong
        print(f"diff: {error}", file=sys.stderr)
        return 2
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report.document(), indent=1) + "\n")
    if report.error:
        print(f"diff: {report.error}", file=sys.stderr)
        return 2
    sys.stdout.write(report_text(report))
    return 0
