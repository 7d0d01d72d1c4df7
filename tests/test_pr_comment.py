"""The render-diff comment: under GitHub's size limit whatever the report, and posted ONE time per
pull request (created, then updated), against a stand-in GitHub API on loopback.

The CLI runs as the comment workflow runs it: `python3 -m components.tools.pr_comment`, here with `-S`
(no site-packages at all), which proves it needs the standard library only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from components.tools.offline import REPO_ROOT
from components.tools.pr_comment import COMMENT_LIMIT, MARKER, build_comment, size

RUN_URL = "https://github.example/o/r/actions/runs/42"


def file_change(host: str, path: str, body_lines: int, seed: str = "", status: str = "modified") -> dict[str, Any]:
    old = "".join(f"-{seed} old line {i} of {path}\n" for i in range(body_lines))
    new = "".join(f"+{seed} new line {i} of {path}\n" for i in range(body_lines))
    diff = f"--- a/{host}/{path}\n+++ b/{host}/{path}\n@@ -1,{body_lines} +1,{body_lines} @@\n{old}{new}"
    return {"host": host, "path": path, "status": status, "diff": diff}


def report(files: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "format": 1,
        "stack": "labs",
        "base": {"title": "main (4b1c0de4b1c0)", "commit": "4b1c0de4b1c0" * 3, "stack_file": True},
        "head": {"title": "working tree at 9f8e7d6c5b4a", "commit": "9f8e7d6c5b4a" * 3, "stack_file": True},
        "changed": bool(files),
        "error": "",
        "files": files,
        "resources": [],
        **extra,
    }


def well_formed(comment: str) -> None:
    """Every <details> closed, every code fence closed by a fence of its own length."""
    assert comment.count("<details") == comment.count("</details>")
    open_fence = ""
    for line in comment.splitlines():
        fence = re.match(r"^(`{3,})", line)
        if not fence:
            continue
        if not open_fence:
            open_fence = fence.group(1)
        elif line.strip() == open_fence:
            open_fence = ""
    assert open_fence == "", "a code block is never closed"


def shown_diffs(comment: str) -> list[str]:
    return re.findall(r"<summary><code>([^<]+)</code>", comment)


def test_a_short_report_is_shown_whole():
    files = [
        file_change("labs-k8s-lb01", "steps/lb-setup/haproxy.cfg", 3),
        file_change("labs-k8s-m01", "steps/prepare/params.env", 2, seed="m"),
    ]
    comment = build_comment(report(files), RUN_URL)
    assert comment.startswith(MARKER + "\n")
    assert shown_diffs(comment) == ["labs-k8s-lb01/steps/lb-setup/haproxy.cfg", "labs-k8s-m01/steps/prepare/params.env"]
    assert "| `labs-k8s-lb01` | `steps/lb-setup/haproxy.cfg` | modified |" in comment
    assert "Not everything fits" not in comment
    assert f"[this workflow run]({RUN_URL})" in comment
    well_formed(comment)


def test_a_long_report_keeps_the_summary_and_the_first_diffs_and_says_where_the_rest_is():
    files = [
        file_change(f"labs-k8s-w{i // 10:02d}", f"steps/prepare/file-{i:03d}.sh", 40, seed=str(i)) for i in range(120)
    ]
    full = sum(size(f["diff"]) for f in files)
    assert full > 3 * COMMENT_LIMIT  # the case: far more than one comment holds
    comment = build_comment(report(files), RUN_URL)
    assert size(comment) <= COMMENT_LIMIT
    assert len(comment) <= COMMENT_LIMIT
    # The summary lists every file, even those whose diff is not shown.
    for change in files:
        assert f"| `{change['host']}` | `{change['path']}` | modified |" in comment
    # The diffs shown are the first ones, in the report's order, each one whole.
    shown = shown_diffs(comment)
    assert 5 < len(shown) < len(files)
    assert shown == [f"{f['host']}/{f['path']}" for f in files[: len(shown)]]
    for change in files[: len(shown) - 1]:
        assert change["diff"] in comment
    assert files[len(shown)]["diff"] not in comment
    rest = len(files) - len(shown)
    footer = comment.rsplit("**Not everything fits in a comment**", 1)[1]
    assert f"the diffs of {rest} more files are not shown" in footer or "one diff above is cut" in footer
    assert f"the `render-diff` artifact of [this workflow run]({RUN_URL})" in footer
    well_formed(comment)


def test_one_huge_diff_is_cut_at_a_line_boundary():
    huge = file_change("labs-k8s-m01", "steps/flannel/kube-flannel.yml", 4000)
    comment = build_comment(report([huge]), RUN_URL)
    assert COMMENT_LIMIT - 3000 < size(comment) <= COMMENT_LIMIT
    assert "*Cut here: the rest of this file's diff is in the full diff.*" in comment
    assert "one diff above is cut" in comment
    shown = comment.split("```diff\n", 1)[1].split("\n```", 1)[0] + "\n"
    assert huge["diff"].startswith(shown)  # whole lines, from the top
    well_formed(comment)


def test_thousands_of_files_shorten_the_summary_too():
    files = [file_change(f"host-{i:04d}", f"dir/file-{i:04d}.yaml", 1, seed=str(i)) for i in range(5000)]
    comment = build_comment(report(files), RUN_URL)
    assert size(comment) <= COMMENT_LIMIT
    assert re.search(r"\| … \| \d+ more files: see the full diff \| \|", comment)
    well_formed(comment)


@pytest.mark.parametrize("limit", [4000, 12000, COMMENT_LIMIT])
def test_any_limit_is_kept_with_multibyte_text(limit):
    # Sizes are UTF-8 bytes: never fewer than the characters GitHub counts.
    files = [file_change("labs-k8s-m01", f"steps/x/файл-{i}.sh", 30, seed="ключ—" * 3) for i in range(40)]
    comment = build_comment(report(files), RUN_URL, limit=limit)
    assert size(comment) <= limit
    shown = shown_diffs(comment)
    assert shown == [f"labs-k8s-m01/{f['path']}" for f in files][: len(shown)]
    assert shown or limit < COMMENT_LIMIT
    well_formed(comment)


def test_a_diff_cannot_close_its_code_block_early():
    change = file_change("labs-k8s-m01", "docs.md", 0)
    change["diff"] += "+```\n+## not a heading of the comment\n+````\n"
    comment = build_comment(report([change]), RUN_URL)
    assert "`````diff\n" in comment
    well_formed(comment)


def test_the_same_change_on_many_machines_is_shown_once():
    files = [
        file_change(f"labs-k8s-{host}", "steps/prepare/params.env", 3) for host in ("m01", "m02", "m03", "w01", "w02")
    ]
    for change in files:  # identical hunks, different file names
        change["diff"] = change["diff"].replace(change["host"], "HOST", 0)
    comment = build_comment(report(files), RUN_URL)
    assert shown_diffs(comment) == ["labs-k8s-m01/steps/prepare/params.env"]
    assert comment.count("the same change as `labs-k8s-m01/steps/prepare/params.env`") == 4


def test_no_change_and_errors_are_said_plainly():
    assert "**No change** to any resource or rendered file." in build_comment(report([]), RUN_URL)
    failed = build_comment(report([], error="the head does not render:\nlabs-k8s:loadBalancer.vip: ..."), RUN_URL)
    assert "**The diff could not be made:**" in failed and "labs-k8s:loadBalancer.vip" in failed
    well_formed(failed)


def test_the_build_command_needs_only_the_standard_library(tmp_path):
    files = [file_change(f"h{i}", "f", 60, seed=str(i)) for i in range(100)]
    (tmp_path / "report.json").write_text(json.dumps(report(files)))
    proc = subprocess.run(
        [
            sys.executable,
            "-S",
            "-m",
            "components.tools.pr_comment",
            "build",
            "--report",
            str(tmp_path / "report.json"),
            "--full-diff-url",
            RUN_URL,
            "--out",
            str(tmp_path / "comment.md"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    comment = (tmp_path / "comment.md").read_text()
    assert comment == build_comment(report(files), RUN_URL)
    assert size(comment) <= COMMENT_LIMIT and "Not everything fits" in comment


# --------------------------------------------------------------------------- posting


class FakeGitHub:
    """The few REST endpoints the post step uses, with pagination (2 comments a page)."""

    PAGE = 2

    def __init__(self) -> None:
        self.pulls: dict[int, dict[str, Any]] = {}
        self.comments: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.next_id = 1000

    def add_comment(self, number: int, login: str, body: str) -> dict[str, Any]:
        self.next_id += 1
        comment = {"id": self.next_id, "number": number, "user": {"login": login}, "body": body}
        self.comments.append(comment)
        return comment

    def on(self, number: int) -> list[dict[str, Any]]:
        return [c for c in self.comments if c["number"] == number]


def _handler(api: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def reply(self, status: int, payload: Any, link: str = "") -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if link:
                self.send_header("Link", link)
            self.end_headers()
            self.wfile.write(data)

        def handle_any(self, method: str) -> None:
            url = urlparse(self.path)
            api.requests.append((method, url.path))
            if self.headers.get("Authorization") != "Bearer t0ken":
                return self.reply(401, {"message": "Bad credentials"})
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
            if match := re.fullmatch(r"/repos/o/r/pulls/(\d+)", url.path):
                pull = api.pulls.get(int(match.group(1)))
                return self.reply(200, pull) if pull else self.reply(404, {"message": "Not Found"})
            if (match := re.fullmatch(r"/repos/o/r/issues/(\d+)/comments", url.path)) and method == "GET":
                page = int(parse_qs(url.query).get("page", ["1"])[0])
                items = api.on(int(match.group(1)))
                chunk = items[(page - 1) * api.PAGE : page * api.PAGE]
                more = page * api.PAGE < len(items)
                following = f"http://{self.headers['Host']}{url.path}?per_page=100&page={page + 1}"
                link = f'<{following}>; rel="next"' if more else ""
                return self.reply(200, chunk, link)
            if match and method == "POST":
                return self.reply(201, api.add_comment(int(match.group(1)), "github-actions[bot]", body["body"]))
            if (match := re.fullmatch(r"/repos/o/r/issues/comments/(\d+)", url.path)) and method == "PATCH":
                (comment,) = [c for c in api.comments if c["id"] == int(match.group(1))]
                if comment["user"]["login"] != "github-actions[bot]":
                    return self.reply(403, {"message": "not yours"})
                comment["body"] = body["body"]
                return self.reply(200, comment)
            return self.reply(404, {"message": "Not Found"})

        def do_GET(self) -> None:
            self.handle_any("GET")

        def do_POST(self) -> None:
            self.handle_any("POST")

        def do_PATCH(self) -> None:
            self.handle_any("PATCH")

    return Handler


@pytest.fixture
def github() -> Iterator[tuple[FakeGitHub, str]]:
    api = FakeGitHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def post(
    url: str, tmp_path: Path, number: int, body: str, head_sha: str = "a" * 40, head_repo: str = "fork/r"
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pull-request.json").write_text(json.dumps({"number": number, "headSha": "ignored"}))
    (tmp_path / "comment.md").write_text(body)
    return subprocess.run(
        [
            sys.executable,
            "-S",
            "-m",
            "components.tools.pr_comment",
            "post",
            "--repo",
            "o/r",
            "--pull-request-file",
            str(tmp_path / "pull-request.json"),
            "--head-sha",
            head_sha,
            "--head-repo",
            head_repo,
            "--body-file",
            str(tmp_path / "comment.md"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"GITHUB_TOKEN": "t0ken", "GITHUB_API_URL": url, "PATH": "/usr/bin:/bin"},
    )


def open_pull(api: FakeGitHub, number: int, sha: str = "a" * 40, repo: str = "fork/r") -> None:
    api.pulls[number] = {"number": number, "state": "open", "head": {"sha": sha, "repo": {"full_name": repo}}}


def test_one_comment_is_created_then_updated(github, tmp_path):
    api, url = github
    open_pull(api, 7)
    # Other people's comments, one of them quoting the marker, spread over several pages.
    for i in range(5):
        api.add_comment(7, "reviewer", f"looks good {i}" + (f"\n> {MARKER}" if i == 3 else ""))
    # The vCenter preview's comment (pulumi/actions) has the same author and no marker.
    preview = api.add_comment(7, "github-actions[bot]", "#### :tropical_drink: `preview` on labs")
    first = post(url, tmp_path, 7, f"{MARKER}\nfirst")
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("created comment")
    second = post(url, tmp_path, 7, f"{MARKER}\nsecond")
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("updated comment")
    mine = [c for c in api.on(7) if c["user"]["login"] == "github-actions[bot]" and c is not preview]
    assert [c["body"] for c in mine] == [f"{MARKER}\nsecond"]
    assert preview["body"] == "#### :tropical_drink: `preview` on labs"
    assert len(api.on(7)) == 7
    # The marker comment sat on the last page: the pages were followed.
    assert sum(1 for method, path in api.requests if method == "GET" and path.endswith("/comments")) >= 3


def test_a_preview_quoting_the_other_marker_is_not_taken_for_its_comment(github, tmp_path):
    """The preview's text is the pull request's (its program prints what it likes): quoted in the
    preview comment, the render diff's marker must not make that comment the render diff's."""
    from components.tools.pr_comment import preview_comment

    api, url = github
    open_pull(api, 11)
    preview = api.add_comment(11, "github-actions[bot]", preview_comment(f"{MARKER}\n```\n@someone <b>x</b>\n"))
    assert "\n````\n" in preview["body"]  # the fence outgrows the text's own backticks
    posted = post(url, tmp_path, 11, f"{MARKER}\nthe diff")
    assert posted.returncode == 0 and posted.stdout.startswith("created comment"), posted.stdout + posted.stderr
    assert MARKER in preview["body"] and "the diff" not in preview["body"]


def test_a_stale_run_or_a_closed_pull_request_is_not_commented(github, tmp_path):
    api, url = github
    open_pull(api, 8, sha="b" * 40)
    stale = post(url, tmp_path, 8, f"{MARKER}\nold", head_sha="a" * 40)
    assert stale.returncode == 0 and "a newer run will comment" in stale.stdout
    other_repo = post(url, tmp_path, 8, f"{MARKER}\nold", head_sha="b" * 40, head_repo="someone/else")
    assert other_repo.returncode == 0 and "a newer run will comment" in other_repo.stdout
    api.pulls[8]["state"] = "closed"
    closed = post(url, tmp_path, 8, f"{MARKER}\nold", head_sha="b" * 40)
    assert closed.returncode == 0 and "is closed: not commented" in closed.stdout
    assert api.on(8) == []


def test_api_errors_fail_the_step(github, tmp_path):
    _, url = github
    missing = post(url, tmp_path, 9, f"{MARKER}\nx")
    assert missing.returncode == 1 and "HTTP 404" in missing.stderr
    unmarked = post(url, tmp_path, 9, "no marker")
    assert unmarked.returncode == 1 and "no marker" in unmarked.stderr


def resource(
    step: int, action: str, name: str, inputs: list[str], secret: list[str] | None = None, cause: str = "inputs"
) -> dict[str, Any]:
    return {
        "step": step,
        "kind": action,
        "action": action,
        "name": name,
        "type": "command:remote:Command",
        "type_label": "step",
        "inputs": inputs,
        "secret_inputs": secret or [],
        "cause": cause,
    }


def test_the_resources_come_first_grouped_as_pulumi_up_runs_them():
    resources = [
        resource(1, "replace", "labs-k8s-lb01-lb-setup", ["triggers", "stdin"], ["triggers", "stdin"]),
        resource(1, "replace", "labs-k8s-lb02-lb-setup", ["triggers", "stdin"], ["triggers", "stdin"]),
        resource(
            2,
            "replace",
            "labs-k8s-m01-kubeadm-init",
            ["triggers"],
            ["triggers"],
            cause="replaced: labs-k8s-lb01-lb-setup",
        ),
    ]
    files = [file_change("labs-k8s-lb01", "steps/lb-setup/haproxy.cfg", 3)]
    comment = build_comment(report(files, resources=resources), RUN_URL)
    assert "**Resources**: 3 to replace, in the order `pulumi up` runs them." in comment
    assert (
        "| 1 | replace | step: `labs-k8s-lb01-lb-setup`, `labs-k8s-lb02-lb-setup` | "
        "`triggers` [secret], `stdin` [secret] |"
    ) in comment
    assert (
        "| 2 | replace (because replaced: labs-k8s-lb01-lb-setup) | step: `labs-k8s-m01-kubeadm-init` | "
        "`triggers` [secret] |"
    ) in comment
    assert comment.index("**Resources**") < comment.index("**Files**") < comment.index("<details")
    # A change of resources alone (a rotated key) is a change: no "No change", no file table.
    only = build_comment(report([], resources=resources[:1]) | {"changed": True}, RUN_URL)
    assert "**No change**" not in only and "**Files**: no rendered file changes." in only
    # A base too old to record its run: said, not hidden.
    old = build_comment(report(files, resources=None), RUN_URL)
    assert "**Resources**: not compared" in old


def test_a_huge_resource_list_is_shortened_too():
    resources = [resource(i, "update", f"step-{i:04d}", ["connection"], ["connection"]) for i in range(4000)]
    comment = build_comment(report([file_change("h", "f", 3)], resources=resources), RUN_URL)
    assert size(comment) <= COMMENT_LIMIT
    assert re.search(r"\| … \| \d+ more resource groups: see the full diff \| \|", comment)
    assert "<summary><code>h/f</code>" in comment  # the first diff still fits
