"""The operator's tools around the program: `python -m components <command>` and what it runs.

Nothing `pulumi up` evaluates imports this package (an import-linter contract, pyproject.toml):
it runs the program under the mock engine (offline.py) to render, diff and tabulate changes
(render.py, render_diff.py, changes.py, artifacts.py, pr_comment.py), checks a checkout before the
Pulumi CLI runs (first_run.py), writes the vCenter roles (privileges.py) and runs failure drills
against the live lab (drills/). Standard library only at import time: the pull-request workflows
run pr_comment.py with the runner's bare python3.
"""
