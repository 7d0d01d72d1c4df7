"""Pure rendering: validated config in, text out. No Pulumi and no network in here.

Config files and scripts are real files under `cloudinit/` (Jinja2 templates where they
vary, plain files where they do not), so they can be read, linted and tested as what they are.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import jinja2

CLOUDINIT_DIR = Path(__file__).resolve().parents[2] / "cloudinit"

# StrictUndefined: a template that names a missing value fails loudly instead of rendering "".
_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(CLOUDINIT_DIR)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
    # Templates are files of this repo, fixed for a run: no mtime check on every render.
    auto_reload=False,
)


def render_template(relative_path: str, **context: object) -> str:
    """Render `cloudinit/<relative_path>` (a Jinja2 template) with the given context."""
    return _ENV.get_template(relative_path).render(**context)


@functools.lru_cache(maxsize=256)
def read_file(relative_path: str) -> str:
    """A file under `cloudinit/` that needs no templating (most scripts)."""
    return (CLOUDINIT_DIR / relative_path).read_text()


# What every step that installs packages (the balancer's, the Kubernetes prepare and upgrade
# steps) sources first: the repair of a dpkg run an earlier attempt left cut off.
INTERRUPTED_DPKG_FILE = "interrupted-dpkg.sh"


def interrupted_dpkg_script() -> str:
    return read_file(f"node/{INTERRUPTED_DPKG_FILE}")


def content_hash(*parts: str) -> str:
    """A short, stable hash of rendered text: used as a re-run trigger and in template names."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


STEP_ROOT = "/var/lib/labs-k8s/steps"
# Where each node keeps the StepLibrary its prepare step installed (root-only, as STEP_ROOT).
LIBRARY_ROOT = "/var/lib/labs-k8s/lib"
BUNDLE_HEREDOC_END = "LABS_K8S_EOF"


def _file_writer(target: str, text: str) -> list[str]:
    """The bundle lines that write `text` to `target`. A text file goes as it is, in a quoted here-document
    (bash copies its body byte for byte: no expansion, no tab stripping); only a file the here-document
    cannot carry exactly (no final newline, a NUL byte, a line that is the delimiter) goes base64. Plain text
    matters for the size: pulumi-command keeps each bundle twice in the state (input and output), and
    the file backend writes the whole state at the start and end of every step (pulumi
    pkg/backend/snapshot.go), so a third more per bundle was a third more on every checkpoint (docs/testing.md)."""
    if text.endswith("\n") and "\0" not in text and BUNDLE_HEREDOC_END not in text.splitlines():
        return [f"cat > {target} <<'{BUNDLE_HEREDOC_END}'", text.removesuffix("\n"), BUNDLE_HEREDOC_END]
    encoded = base64.b64encode(text.encode()).decode()
    body = [encoded[i : i + 76] for i in range(0, len(encoded), 76)]
    return [f"base64 -d > {target} <<'{BUNDLE_HEREDOC_END}'", *body, BUNDLE_HEREDOC_END]


@dataclass(frozen=True)
class StepLibrary:
    """Files that many steps on a node source (lib.sh, upgrade-lib.sh), sent to each node once.

    The step that prepares a node installs them under LIBRARY_ROOT/<digest> (`installs_library` of
    step_bundle); a later step on that node, or through the VIP on a control plane, copies them from
    there (`from_library`), each checked by its SHA-256 in the step's own bundle, instead of carrying
    them. Why: pulumi-command keeps every bundle twice in the state (input and output) and the file
    backend writes the whole state at each step's start and end (pulumi pkg/backend/snapshot.go);
    carried by every step, lib.sh alone was half of a 10-worker lab's 10 MB state (docs/testing.md).
    The digest names the content, so a new library is a new directory, a changed bundle for every
    step that uses it (they re-run as when they carried it) and a re-run of each node's prepare."""

    files: Mapping[str, str]

    @functools.cached_property
    def sums(self) -> dict[str, str]:
        return {name: hashlib.sha256(text.encode()).hexdigest() for name, text in sorted(self.files.items())}

    @functools.cached_property
    def digest(self) -> str:
        return hashlib.sha256("".join(f"{s}  {n}\n" for n, s in self.sums.items()).encode()).hexdigest()[:16]

    @property
    def directory(self) -> str:
        return f"{LIBRARY_ROOT}/{self.digest}"

    def shared_with(self, files: Mapping[str, str]) -> list[str]:
        """The names of `files` that are the library's, byte for byte."""
        return sorted(name for name, text in files.items() if self.files.get(name) == text)


def _install_library(library: StepLibrary) -> list[str]:
    """Write the library into a new directory, then put it in place in one rename, and drop every
    other library: only the steps of this `up` use one, and they all name this digest."""
    root, target = shlex.quote(LIBRARY_ROOT), shlex.quote(library.directory)
    lines = [f"install -d -m 0700 {root}", f"library_new=$(mktemp -d {root}/.new.XXXXXX)"]
    for name, text in sorted(library.files.items()):
        lines += _file_writer(f'"$library_new"/{shlex.quote(name)}', text)
    lines += [
        f"rm -rf -- {target}",
        f'mv -T -- "$library_new" {target}',
        f"find {root} -mindepth 1 -maxdepth 1 ! -name {shlex.quote(library.digest)} -exec rm -rf -- {{}} +",
    ]
    return lines


def _copy_from_library(
    step: str, step_dir: str, library: StepLibrary, names: Sequence[str], installer: str
) -> list[str]:
    """Copy `names` from the node's library into the step directory and check each copy's SHA-256;
    without them (a node whose prepare never ran this version, a disk reverted to a VM snapshot)
    stop and say which step puts them there."""
    source, target = shlex.quote(library.directory), shlex.quote(step_dir)
    missing = shlex.quote(
        f"labs-k8s[{step}]: this node lacks the step library {library.digest} ({', '.join(names)}) "
        f"that {installer} installs under {LIBRARY_ROOT}: re-run that step with "
        f'`make up ARGS="--replace <its URN>"` (pulumi stack --show-urns lists it)'
    )
    lines = [f"if ! cp -- {' '.join(f'{source}/{shlex.quote(n)}' for n in names)} {target}/ 2>/dev/null ||"]
    lines.append(f"    ! (cd {target} && sha256sum --check --strict --status) <<'{BUNDLE_HEREDOC_END}'")
    lines += [f"{library.sums[n]}  {n}" for n in names]
    lines += [BUNDLE_HEREDOC_END, f"then echo {missing} >&2; exit 1; fi"]
    return lines


def step_bundle(
    step: str,
    files: Mapping[str, str],
    entrypoint: str,
    args: tuple[str, ...] = (),
    secret_files: Sequence[str] = (),
    *,
    installs_library: StepLibrary | None = None,
    from_library: tuple[StepLibrary, str] | None = None,
) -> str:
    """One self-contained bash script that a remote command feeds to `sudo bash -s` on stdin.

    It writes `files` (name -> text) into a root-only step directory, then runs `entrypoint`
    (one of the files) from there. Sending the bundle on stdin keeps the command line, and so
    `ps` and the provider's logs, free of file contents and secrets. `secret_files` (those that
    hold a secret: a kubeadm configuration with the token) are removed when the entrypoint ends,
    however it ends: the next run brings them again, nothing keeps them on the node's disk.
    `installs_library`: the bundle also installs that StepLibrary on the node; `from_library`
    (library, the step that installs it): the files of `files` that are the library's are copied
    from the node's copy instead of travelling in the bundle.
    """
    if entrypoint not in files:
        raise ValueError(f"entrypoint {entrypoint!r} is not among the bundle's files {sorted(files)}")
    step_dir = f"{STEP_ROOT}/{step}"
    lines = [
        "#!/usr/bin/env bash",
        "set -euo pipefail",
        "umask 077",
        f"install -d -m 0700 {shlex.quote(step_dir)}",
    ]
    if installs_library is not None:
        lines += _install_library(installs_library)
        # Its own copies of the library's files come from there too: not twice in one bundle.
        from_library = (installs_library, step)
    shared: list[str] = []
    if from_library is not None:
        library, installer = from_library
        shared = [name for name in library.shared_with(files) if name != entrypoint]
        if shared:
            lines += _copy_from_library(step, step_dir, library, shared, installer)
    for name, text in sorted(files.items()):
        if "/" in name or name.startswith("."):
            raise ValueError(f"bundle file names are flat: {name!r}")
        if name not in shared:
            lines += _file_writer(shlex.quote(f"{step_dir}/{name}"), text)
    quoted_args = " ".join(shlex.quote(a) for a in args)
    lines.append(f"cd {shlex.quote(step_dir)}")
    # "$@": what the remote command passes after `bash -s --` (teardown-guard's set/clear).
    run = f'bash ./{shlex.quote(entrypoint)} {quoted_args} "$@"'.replace('  "$@"', ' "$@"')
    if secret_files:
        unknown = sorted(set(secret_files) - set(files))
        if unknown:
            raise ValueError(f"secret files {unknown} are not among the bundle's files")
        removed = " ".join(shlex.quote(f"{step_dir}/{name}") for name in sorted(secret_files))
        lines.append(f"trap {shlex.quote(f'rm -f -- {removed}')} EXIT")
        lines.append(run)
    else:
        lines.append(f"exec {run}")
    return "\n".join(lines) + "\n"


_FILE_IN_BUNDLE = re.compile(
    rf"^(base64 -d|cat) > (\S+) <<'{BUNDLE_HEREDOC_END}'\n((?:[^\n]*\n)*?){BUNDLE_HEREDOC_END}\n", re.M
)


def bundle_files(bundle: str) -> dict[str, str]:
    """The files a step bundle writes (name -> text): step_bundle read back, for the offline engine's
    answers and the tests. Each file is in the bundle in full, so nothing is looked up elsewhere."""
    files = {}
    for writer, target, body in _FILE_IN_BUNDLE.findall(bundle):
        name = shlex.split(target)[0].rsplit("/", 1)[-1]
        files[name] = base64.b64decode("".join(body.split())).decode() if writer == "base64 -d" else body
    return files
