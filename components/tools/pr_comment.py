"""The pull-request comment of `python -m components diff`: built from its JSON report, posted once.

It is kept under GitHub's size limit, and posted as ONE comment per pull request (found again by a
hidden marker).

Standard library only, and importing nothing else of this package: the workflow that posts
(.github/workflows/render-diff-comment.yml) runs the default branch's copy of this file with the
runner's python3, and treats the pull request's report as data.

  python3 -m components.tools.pr_comment build --report report.json [--full-diff-url URL] [--out comment.md]
  python3 -m components.tools.pr_comment post --repo OWNER/NAME --pull-request-file pull-request.json \\
      --head-sha SHA --head-repo OWNER/NAME --body-file comment.md [--marker preview]
      (GITHUB_TOKEN from the environment)
  python3 -m components.tools.pr_comment preview --text preview.txt [--run-url URL] [--out comment.md]

`preview` makes the vCenter preview job's comment (.github/workflows/preview.yml) from the text of
`pulumi preview --diff`: that job runs the CLI itself rather than pulumi/actions, which reads every
stack output with --show-secrets (the admin kubeconfig among them) into its step outputs.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

MARKER = "<!-- labs-k8s render-diff -->"
PREVIEW_MARKER = "<!-- labs-k8s pulumi-preview -->"
MARKERS = {"render-diff": MARKER, "preview": PREVIEW_MARKER}
# GitHub refuses a comment body over 65,536 characters. Sizes here are UTF-8 bytes, never fewer
# than the characters GitHub counts, so a comment that fits here fits there.
COMMENT_LIMIT = 65536
ARTIFACT = "render-diff"
COMMENT_AUTHOR = "github-actions[bot]"  # who posts with the workflow's GITHUB_TOKEN
# Room kept for the closing note (what is not shown and where it is).
_FOOTER_ROOM = 800
# Below this much room, a cut diff would be too short to help: stop at the previous one.
_MIN_CUT = 1500
# Diffs up to this many lines are shown unfolded.
_OPEN_LINES = 60


def size(text: str) -> int:
    return len(text.encode())


def _code(text: str) -> str:
    """An inline code span for a name from the report (which a pull request controls)."""
    return "`" + text.replace("`", "'").replace("\n", " ").replace("|", "\\|") + "`"


def _status(change: Mapping[str, Any]) -> str:
    status = str(change.get("status"))
    return status if status in ("added", "removed", "modified") else "changed"


def _fence(body: str, info: str = "") -> str:
    """A code block no line of `body` can close: the fence is longer than any backtick run in it."""
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{body}{'' if body.endswith(chr(10)) else chr(10)}{fence}\n"


def _diff_body(diff: str) -> str:
    """The hunks of a file's diff, without the ---/+++ header lines (equal bodies, equal changes)."""
    lines = diff.splitlines(keepends=True)
    return "".join(lines[2:]) if len(lines) >= 2 and lines[0].startswith("--- ") else diff


def _commit(side: Mapping[str, Any]) -> str:
    text = _code(str(side.get("commit") or "?")[:12])
    return text + " with uncommitted changes" if side.get("uncommitted") else text


def _header(report: Mapping[str, Any]) -> str:
    return (
        f"{MARKER}\n### Rendered change of stack {_code(str(report.get('stack', '?')))}\n\n"
        f"Base {_commit(report.get('base') or {})} → head {_commit(report.get('head') or {})}, rendered offline by "
        "`python -m components diff` (no vCenter involved): what `pulumi up` would do to each resource, and "
        "every file each machine is given.\n\n"
    )


def _limited_rows(rows: Sequence[str], room: int, what: str) -> str:
    """As many rows as fit in `room`, then one line saying how many were left out."""
    out: list[str] = []
    used = 0
    for index, row in enumerate(rows):
        if used + size(row) > room:
            out.append(f"| … | {len(rows) - index} more {what}: see the full diff | |\n")
            break
        out.append(row)
        used += size(row)
    return "".join(out)


_ACTIONS = ("create", "replace", "update", "delete")


def _resources_section(resources: Sequence[Mapping[str, Any]] | None, room: int) -> str:
    """The resources' effects grouped as `pulumi up` runs them (the runbook's change table's columns)."""
    if resources is None:
        return (
            "**Resources**: not compared (the base's code cannot record its run; it predates "
            "`render --fingerprint-key`).\n\n"
        )
    counts = {action: sum(1 for r in resources if r.get("action") == action) for action in _ACTIONS}
    said = ", ".join(f"{counts[a]} to {a}" for a in _ACTIONS if counts[a]) or "no change"
    if not resources:
        return f"**Resources**: {said}.\n\n"
    groups: dict[tuple[Any, ...], list[str]] = {}
    for change in resources:
        secret = set(change.get("secret_inputs") or [])
        inputs = ", ".join(_code(str(i)) + (" [secret]" if i in secret else "") for i in change.get("inputs") or [])
        cause = str(change.get("cause") or "inputs")
        key = (
            change.get("step"),
            str(change.get("kind")),
            html.escape(str(change.get("type_label"))),
            inputs,
            "" if cause == "inputs" else f" (because {cause})",
        )
        groups.setdefault(key, []).append(_code(str(change.get("name"))))
    rows = [
        f"| {step} | {kind}{because} | {label}: {', '.join(names)} | {inputs or '—'} |\n"
        for (step, kind, label, inputs, because), names in groups.items()
    ]
    title = (
        f"**Resources**: {said}, in the order `pulumi up` runs them.\n\n"
        "| # | what happens | resources | inputs that change |\n|---|---|---|---|\n"
    )
    return title + _limited_rows(rows, room - size(title), "resource groups") + "\n"


def _files_section(files: Sequence[Mapping[str, Any]], room: int) -> str:
    hosts = sorted({str(f["host"]) for f in files})
    rows = [f"| {_code(str(f['host']))} | {_code(str(f['path']))} | {_status(f)} |\n" for f in files]
    media = " (`golden-template` is the template's install media)" if "golden-template" in hosts else ""
    title = (
        f"**Files**: {len(files)} changed on {len(hosts)} {'machine' if len(hosts) == 1 else 'machines'}"
        f"{media}\n\n| host | file | change |\n|---|---|---|\n"
    )
    return title + _limited_rows(rows, room - size(title), "files") + "\n"


def _file_block(change: Mapping[str, Any], diff: str, cut: bool = False) -> str:
    name = f"{change['host']}/{change['path']}"
    lines = diff.count("\n")
    opened = " open" if lines <= _OPEN_LINES else ""
    note = "\n*Cut here: the rest of this file's diff is in the full diff.*\n" if cut else ""
    # Markdown is not rendered inside <summary>: HTML, escaped (names come from the pull request).
    return (
        f"<details{opened}><summary><code>{html.escape(name)}</code> ({_status(change)}, {lines} lines)"
        "</summary>\n\n"
        f"{_fence(diff, 'diff')}{note}\n</details>\n\n"
    )


def _same_block(change: Mapping[str, Any], first: Mapping[str, Any]) -> str:
    return (
        f"{_code(str(change['host']) + '/' + str(change['path']))}: the same change as "
        f"{_code(str(first['host']) + '/' + str(first['path']))}.\n\n"
    )


def _cut_diff(diff: str, room: int) -> str:
    out: list[str] = []
    used = 0
    for line in diff.splitlines(keepends=True):
        if used + size(line) > room:
            break
        out.append(line)
        used += size(line)
    return "".join(out)


def _footer(not_shown: int, cut: bool, full_diff_url: str | None) -> str:
    where = (
        f"the `{ARTIFACT}` artifact of [this workflow run]({full_diff_url})"
        if full_diff_url
        else f"the `{ARTIFACT}` artifact of this pull request's `render diff` workflow run"
    )
    if not not_shown and not cut:
        return f"The same report as text: {where}.\n"
    parts = []
    if cut:
        parts.append("one diff above is cut")
    if not_shown:
        parts.append(f"the diffs of {not_shown} more {'file are' if not_shown == 1 else 'files are'} not shown")
    return (
        f"**Not everything fits in a comment** (at most {COMMENT_LIMIT:,} characters): {' and '.join(parts)}. "
        f"The full diff is {where}.\n"
    )


def build_comment(report: Mapping[str, Any], full_diff_url: str | None = None, limit: int = COMMENT_LIMIT) -> str:
    """The comment's markdown, at most `limit` bytes: the summary first, then the diffs in order
    (host by host) while they fit, then where the full diff is."""
    text = _header(report)
    if report.get("error"):
        error = str(report["error"])[-(limit // 2) :]
        return text + "**The diff could not be made:**\n\n" + _fence(error) + "\n" + _footer(0, False, full_diff_url)
    files = list(report.get("files") or [])
    if not report.get("changed"):
        return text + "**No change** to any resource or rendered file.\n"
    for side in ("base", "head"):
        if report.get(side, {}).get("stack_file") is False:
            text += f"The stack file does not exist at the {side}: it renders nothing.\n\n"
    budget = limit - _FOOTER_ROOM
    text += _resources_section(report.get("resources"), (budget - size(text)) // 3)
    if not files:
        return text + "**Files**: no rendered file changes.\n"
    text += _files_section(files, (budget - size(text)) // 2)
    shown: dict[str, Mapping[str, Any]] = {}  # diff body -> first file shown with it
    not_shown = 0
    cut = False
    for index, change in enumerate(files):
        diff = str(change.get("diff", ""))
        body = _diff_body(diff)
        block = _same_block(change, shown[body]) if body in shown else _file_block(change, diff)
        if size(text) + size(block) <= budget:
            text += block
            shown.setdefault(body, change)
            continue
        room = budget - size(text) - size(_file_block(change, "", cut=True))
        if room >= _MIN_CUT:
            text += _file_block(change, _cut_diff(diff, room), cut=True)
            cut = True
            not_shown = len(files) - index - 1
        else:
            not_shown = len(files) - index
        break
    return text + _footer(not_shown, cut, full_diff_url)


# --------------------------------------------------------------------------- posting


class GitHubError(Exception):
    pass


def _request(method: str, url: str, token: str, payload: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(
        url,
        data=data,
        method=method,
        headers={
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {token}",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": "labs-k8s-render-diff",
            **({"Content-Type": "application/json"} if data is not None else {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null"), response.headers.get("Link", "")
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:500]
        raise GitHubError(f"{method} {url}: HTTP {error.code}: {detail}") from None


def _pages(url: str, token: str) -> Iterator[Any]:
    next_url: str | None = url
    while next_url:
        items, link = _request("GET", next_url, token)
        yield from items
        match = re.search(r'<([^>]+)>;\s*rel="next"', link)
        next_url = match.group(1) if match else None


def preview_comment(text: str, run_url: str | None = None, limit: int = COMMENT_LIMIT) -> str:
    """The preview's text in a code block under the marker; its last lines (the summary, any
    error) are kept when it is longer than a comment, and the run's log has all of it."""
    header = f"{PREVIEW_MARKER}\n### `pulumi preview --diff` of stack `labs`\n\n"
    footer = f"\nThe whole output: the log of [this workflow run]({run_url}).\n" if run_url else ""
    body = text if text.strip() else "(no output)\n"
    room = limit - size(header) - size(footer) - 200
    if size(_fence(body)) > room:
        lines = body.splitlines(keepends=True)
        used, first = 0, len(lines)
        # The fence grows with the longest backtick run: keep 100 bytes for it and the note.
        while first > 0 and used + size(lines[first - 1]) < room - 100:
            first -= 1
            used += size(lines[first])
        body = f"[{first} earlier lines not shown]\n" + "".join(lines[first:])
    return header + _fence(body) + footer


def post_comment(
    api: str,
    repo: str,
    token: str,
    number: int,
    body: str,
    head_sha: str,
    head_repo: str,
    author: str = COMMENT_AUTHOR,
    marker: str = MARKER,
) -> str:
    """Create or update the one marked comment on pull request `number`, if that pull request is
    open and its head is still `head_sha` from `head_repo` (the workflow_run event's own values:
    the number comes from the pull request's artifact, so it is checked, not trusted)."""
    if not body.startswith(marker):
        raise GitHubError("the comment has no marker at its start: it could never be found again to update")
    base = f"{api.rstrip('/')}/repos/{repo}"
    pull, _ = _request("GET", f"{base}/pulls/{number}", token)
    if pull.get("state") != "open":
        return f"pull request #{number} is {pull.get('state')}: not commented"
    if pull["head"]["sha"] != head_sha or (pull["head"].get("repo") or {}).get("full_name") != head_repo:
        return (
            f"pull request #{number} is at {pull['head']['sha'][:12]}, not {head_sha[:12]} of {head_repo}: "
            "a newer run will comment"
        )
    for comment in _pages(f"{base}/issues/{number}/comments?per_page=100", token):
        # The marker opens the comment: one quoted inside another comment's text (a preview's
        # output is the pull request's) does not make that comment this one.
        if (comment.get("user") or {}).get("login") == author and (comment.get("body") or "").startswith(marker):
            _request("PATCH", f"{base}/issues/comments/{comment['id']}", token, {"body": body})
            return f"updated comment {comment['id']} on pull request #{number}"
    created, _ = _request("POST", f"{base}/issues/{number}/comments", token, {"body": body})
    return f"created comment {created['id']} on pull request #{number}"


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m components.tools.pr_comment", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="write the comment's markdown from a `diff --json` report")
    build.add_argument("--report", type=Path, required=True)
    build.add_argument("--full-diff-url", help="where the full diff is (the workflow run's page)")
    build.add_argument("--limit", type=int, default=COMMENT_LIMIT, help=argparse.SUPPRESS)
    build.add_argument("--out", type=Path, help="file to write (default: standard output)")
    post = commands.add_parser("post", help="create or update the one marked comment")
    post.add_argument("--repo", required=True, help="OWNER/NAME of the base repository")
    post.add_argument("--pull-request-file", type=Path, required=True, help='{"number": N} from the artifact')
    post.add_argument("--head-sha", required=True, help="the workflow_run's head_sha")
    post.add_argument("--head-repo", required=True, help="the workflow_run's head_repository.full_name")
    post.add_argument("--body-file", type=Path, required=True)
    post.add_argument("--marker", choices=sorted(MARKERS), default="render-diff", help="which one comment")
    preview = commands.add_parser("preview", help="write the vCenter preview's comment from its text")
    preview.add_argument("--text", type=Path, required=True)
    preview.add_argument("--run-url")
    preview.add_argument("--out", type=Path, help="file to write (default: standard output)")
    args = parser.parse_args(argv)
    if args.command == "preview":
        comment = preview_comment(args.text.read_text(errors="replace"), args.run_url)
        if args.out:
            args.out.write_text(comment)
        else:
            sys.stdout.write(comment)
        return 0
    if args.command == "build":
        comment = build_comment(json.loads(args.report.read_text()), args.full_diff_url, args.limit)
        if args.out:
            args.out.write_text(comment)
        else:
            sys.stdout.write(comment)
        return 0
    token = os.environ.get("GITHUB_TOKEN", "")
    if not token:
        print("GITHUB_TOKEN is not set", file=sys.stderr)
        return 2
    number = json.loads(args.pull_request_file.read_text()).get("number")
    if not isinstance(number, int) or number <= 0:
        print(f"{args.pull_request_file}: no pull request number", file=sys.stderr)
        return 2
    api = os.environ.get("GITHUB_API_URL", "https://api.github.com")
    try:
        print(
            post_comment(
                api,
                args.repo,
                token,
                number,
                args.body_file.read_text(),
                args.head_sha,
                args.head_repo,
                marker=MARKERS[args.marker],
            )
        )
    except GitHubError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
