"""The real Pulumi CLI's figures (docs/testing.md): what it costs to build, and how long the
program takes on the real engine. Needs root (network namespaces), as `make test` does.

Prints:
- the toolchain build: warm (nothing to rebuild), and cold with `--cold` (an empty Go build
  cache of its own: about 10 minutes on 2 cores, so it is opt-in);
- `preview` of a new stack made the README's way, for the default lab and for 50 workers: the
  whole program (validation, previous state, preflight against vcsim) until the engine loads the
  vsphere provider plugin, which the Go module proxy refuses, so this is the engine's and the
  program's time before any vSphere resource, not a whole preview;
- the template layer (our dynamic provider against vcsim): `up`, then a no-change `preview`.

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
    hosts = "\n".join(f"        - {{name: labs-k8s-w{i:02d}, ip: 10.3.60.{109 + i}}}" for i in range(1, count + 1))
    text = lab_stack_file.read_text()
    start = text.index("    workers:\n")
    begin = text.index("      hosts:\n", start) + len("      hosts:\n")
    end = text.index("  labs-k8s:loadBalancer:", begin)
    lab_stack_file.write_text(text[:begin] + hosts + "\n" + text[end:])


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
        for label, extra in (("default lab (7 VMs)", None), ("50 workers", 50)):
            lab = start_lab(root / f"lab-{extra or 0}", vcsim_binary(), served)
            try:
                readme_setup(lab, sha, ISO)
                if extra:
                    set_workers(lab.workspace / f"Pulumi.{lab.stack}.yaml", extra)
                started = time.monotonic()
                lab.engine("preview")
                print(f"preview of a new stack, {label}, until the vsphere plugin: {time.monotonic() - started:.1f} s")
                if not extra:
                    started = time.monotonic()
                    up = lab.engine("up", program="template")
                    assert up.engine_result()["ok"], up.output[-3000:]
                    print(f"template layer up (dynamic provider, vcsim): {time.monotonic() - started:.1f} s")
                    started = time.monotonic()
                    again = lab.engine("preview", program="template", expect_no_changes=True)
                    assert again.engine_result()["ok"], again.output[-3000:]
                    print(f"template layer preview, no change: {time.monotonic() - started:.1f} s")
            finally:
                stop_lab(lab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
