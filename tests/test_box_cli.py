"""`make box` and `make box-down` as a user meets them (tests/box_cli.py, issue #51): what the
terminal shows, the order of the checks, Ctrl-C, and what the build scripts assume of the machine.
"""

from __future__ import annotations

import subprocess

from components.tools.offline import REPO_ROOT


def test_no_tracked_file_names_a_directory_of_one_machine() -> None:
    """The third-party snapshots are found from the checkout (../shared/third_party) or
    LABS_K8S_THIRD_PARTY: an absolute path of one machine means nothing on a user's."""
    found = subprocess.run(
        ["git", "grep", "-nIF", "/work/shared", "--", ".", ":!tests/test_box_cli.py"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert found.stdout == "", f"machine-specific paths:\n{found.stdout}"
