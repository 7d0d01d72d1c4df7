"""The real Pulumi CLI's figures (docs/testing.md): what it costs to build, and how long the
program takes on the real engine. Needs root (network namespaces), as `make test` does.

Prints:
- the toolchain build: warm (nothing to rebuild), and cold with `--cold` (an empty Go build
  cache of its own: about 10 minutes on 2 cores, so it is opt-in);
- for the default lab and for 10 workers, on the real CLI, language host and plugins against
  vcsim: `make preview` of a new stack; `make up LAYER=vsphere` from empty (the template built
  once, then reused: the second lab's template comes from the same vcsim only in the first lab, so
  each lab builds its own, which is seconds with the stand-in ISO), and the engine's own share of
  it (wall time minus the time inside provider calls, from the `--event-log`'s resourcePreEvent ->
  resOutputsEvent pairs); a no-change `make preview LAYER=vsphere` (goal: under 60 s for the
  default lab).

    sudo .venv/bin/python bench/engine.py [--cold]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.pulumi_engine import BUILD_SCRIPT, readme_setup, start_lab, stop_lab
from tests.standin_iso import build_standin_netinst
from tests.vcsim import vcsim_binary

ISO = "debian-12.12.0-amd64-netinst.iso"


def timed_build(env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, check=True, capture_output=True)
    return time.monotonic() - started


def set_workers(lab_stack_file: Path, count: int) -> None:
    """`count` workers at 10.3.60.110 and up (inside the example's network.cidr, past the VIP)."""
    import yaml

    settings = yaml.safe_load(lab_stack_file.read_text())
    settings["config"]["labs-k8s:nodes"]["workers"]["hosts"] = [
        {"name": f"labs-k8s-w{i:02d}", "ip": f"10.3.60.{109 + i}"} for i in range(1, count + 1)
    ]
    lab_stack_file.write_text(yaml.safe_dump(settings))


def provider_seconds(events: list[dict[str, object]]) -> float:
    """Time inside provider calls: from each step's resourcePreEvent to its resOutputsEvent (or
    failure), merged where steps overlap (with --parallel 1 they do not)."""
    starts: dict[str, float] = {}
    spans: list[tuple[float, float]] = []
    for event in events:
        stamp = float(event.get("timestamp", 0))  # type: ignore[arg-type]
        for kind in ("resourcePreEvent", "resOutputsEvent", "resOpFailedEvent"):
            body = event.get(kind)
            if not isinstance(body, dict):
                continue
            urn = str(body.get("metadata", {}).get("urn", ""))
            if kind == "resourcePreEvent":
                starts[urn] = stamp
            elif urn in starts:
                spans.append((starts.pop(urn), stamp))
    return busy(spans)


def busy(spans: list[tuple[float, float]]) -> float:
    """How long at least one of these steps was running (the union of their intervals)."""
    total, reached = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cold", action="store_true", help="also time a build with an empty Go build cache")
    args = parser.parse_args()

    print(f"toolchain build, warm: {timed_build(dict(os.environ)):.1f} s")
    if args.cold:
        with tempfile.TemporaryDirectory() as cache:
            cold_env = {**os.environ, "GOCACHE": cache}
            out = Path(
                subprocess.run(
                    ["bash", str(BUILD_SCRIPT)], env=os.environ, check=True, capture_output=True, text=True
                ).stdout.split()[-1]
            ).parent
            shutil.rmtree(out)  # the cached binaries, so the build runs
            print(f"toolchain build, cold (empty Go build cache, modules downloaded): {timed_build(cold_env):.1f} s")

    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        served = root / "served"
        served.mkdir()
        (root / "standin").mkdir()
        shutil.copy2(build_standin_netinst(root / "standin"), served / ISO)
        sha = hashlib.sha256((served / ISO).read_bytes()).hexdigest()
        for label, extra in (("default lab (7 VMs)", None), ("10 workers", 10)):
            lab = start_lab(root / f"lab-{extra or 0}", vcsim_binary(), served)
            try:
                readme_setup(lab, sha, ISO)
                if extra:
                    set_workers(lab.workspace / f"Pulumi.{lab.stack}.yaml", extra)
                started = time.monotonic()
                made = lab.make("preview")
                assert made.ok, made.output[-3000:]
                print(f"{label}: make preview of a new stack: {time.monotonic() - started:.1f} s")
                started = time.monotonic()
                up = lab.make("up", layer="vsphere", args="--yes", timeout=1800)
                wall = time.monotonic() - started
                assert up.ok, up.output[-3000:]
                inside = provider_seconds(up.event_log())
                print(
                    f"{label}: make up LAYER=vsphere from empty: {wall:.1f} s,"
                    f" the engine's own share {wall - inside:.1f} s",
                )
                started = time.monotonic()
                again = lab.make("preview", layer="vsphere", args="--expect-no-changes")
                assert again.ok, again.output[-3000:]
                print(f"{label}: make preview LAYER=vsphere, no change: {time.monotonic() - started:.1f} s")
            finally:
                stop_lab(lab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
