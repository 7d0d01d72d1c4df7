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


def content_hash(*parts: str) -> str:
    """A short, stable hash of rendered text: used as a re-run trigger and in template names."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


STEP_ROOT = "/var/lib/labs-k8s/steps"
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


def step_bundle(
    step: str,
    files: Mapping[str, str],
    entrypoint: str,
    args: tuple[str, ...] = (),
    secret_files: Sequence[str] = (),
) -> str:
    """One self-contained bash script that a remote command feeds to `sudo bash -s` on stdin.

    It writes `files` (name -> text) into a root-only step directory, then runs `entrypoint`
    (one of the files) from there. Sending the bundle on stdin keeps the command line, and so
    `ps` and the provider's logs, free of file contents and secrets. `secret_files` (those that
    hold a secret: a kubeadm configuration with the token) are removed when the entrypoint ends,
    however it ends: the next run brings them again, nothing keeps them on the node's disk.
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
    for name, text in sorted(files.items()):
        if "/" in name or name.startswith("."):
            raise ValueError(f"bundle file names are flat: {name!r}")
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
