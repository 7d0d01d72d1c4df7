# labs-k8s. After README "Your first lab" (tools, a backend, the site's stack file and secrets),
# `make up STACK=<site>` builds the lab and `make test` runs the suite; `make help` lists the rest.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

# No default stack for up/preview/destroy: with a default of `labs`, a new shell that forgot
# `export STACK` created a stack named after the example and wrote its encryptionsalt into the
# tracked Pulumi.labs.yaml. `make render` alone, offline, falls back to the example.
STACK ?=
# Passed to the Pulumi CLI by up, preview and destroy: ARGS='--yes', '--target URN', '--parallel 4'.
ARGS ?=
# How many resource operations the CLI runs at once. Its own default, 4 per local core
# (cmd/pulumi/operations/up.go defaultParallel), bounds its memory on programs of a thousand
# resources at once (pulumi/pulumi#14989). Here nearly every operation is a step running on its own
# machine over SSH or a vCenter task, the CLI only waiting: at 8 (a 2-core jump host) the 15
# machines of a 10-worker lab prepared in two waves, each step of the second waiting for a slot
# (bench/lab_box.py, docs/testing.md). 64 is wider than that lab's graph (29 at once at most) and
# still a bound; vCenter queues the tasks it cannot run yet. A PULUMI_PARALLEL of your own, or
# ARGS='--parallel N', wins. Set for the CLI's operations only, not for `make test` and the rest.
up preview destroy: export PULUMI_PARALLEL ?= 64
# ARGS reaches the CLI unexpanded: every nested resource's URN holds `$`
# (`...Lab$labs-k8s:fleet:NodeFleet$...`), which make took for its variables and the shell for
# its own, so `ARGS='--replace URN'` named no resource. It goes through the environment as typed
# ($(value): make does not expand it) and is split by shlex (quotes group words, nothing expands)
# into the bash array `user_args`, one word per line.
export LABS_K8S_MAKE_ARGS = $(value ARGS)
USER_ARGS = mapfile -t user_args < <($(PY) -c 'import os, shlex; print(*shlex.split(os.environ["LABS_K8S_MAKE_ARGS"]), sep="\n")' | sed '/^$$/d');
# LAYER=vsphere (the template, the VMs and the DRS rules, no remote step over SSH) or LAYER=template:
# up or preview only that part, e.g. a first run against a new vCenter before the nodes are
# reachable. Its `--target` URNs (python -m components targets, components/tools/targets.py) hold
# `$` and `*`, which make and the shell would expand in ARGS='--target ...': they are read into a
# bash array and passed quoted, so neither expansion, globbing nor word splitting touches them.
LAYER ?=
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# Our lock files hold PyPI hashes: ignore machine-wide pip settings (extra indexes, find-links).
PIP_ENV := PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS=

.PHONY: help up preview destroy render test lint lock bench venv venv-dev system-deps vcsim toolchain kube stack-named box box-down box-shell

help:
	@echo "make up       create the virtualenv, install pinned dependencies, check, pulumi up --stack \$$STACK"
	@echo "make preview  check, then pulumi preview --stack \$$STACK --diff (what a pull request shows)"
	@echo "make destroy  check, then pulumi destroy --stack \$$STACK --refresh (never creates a stack)"
	@echo "              these three need STACK=<site> or export STACK (README, \"Your first lab\", step 3);"
	@echo "              ARGS='...' is passed to the Pulumi CLI: make up ARGS='--yes --parallel 4',"
	@echo "              ARGS='--target URN', ARGS='--replace URN'"
	@echo "              LAYER=vsphere: up or preview the vSphere half only (the template, the VMs and the"
	@echo "              DRS rules, no step over SSH); LAYER=template: the golden template alone"
	@echo "make render   offline: plan.json, graph.mmd and every file pushed to a machine, into render/"
	@echo "make test     create the virtualenv, install what the tests need, run the whole suite"
	@echo "make lint     ruff (lint and format), mypy, the import contracts and shellcheck"
	@echo "make venv     only the virtualenv .venv with the pinned runtime dependencies (Python 3.11+)"
	@echo "make lock     renew requirements*.txt (pinned, with hashes) from requirements*.in"
	@echo "make box      no vCenter? the lab in a box (Linux, root): vcsim and a host per VM, then make up"
	@echo "make box-shell a shell on the box's stack (pulumi, its PULUMI_HOME and passphrase set)"
	@echo "make box-down remove everything make box made"
	@echo "make bench    print the benchmarks' figures (as root: the failover bench runs in network namespaces)"

$(VENV)/.runtime: requirements.txt
	bash scripts/make-venv.sh $(PYTHON) $(VENV)
	$(PIP_ENV) $(PIP) install -q --require-hashes -r requirements.txt
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(PIP_ENV) $(PIP) install -q --require-hashes -r requirements.txt -r requirements-dev.txt
	touch $@

venv: $(VENV)/.runtime
venv-dev: $(VENV)/.dev

# The CLI runs without SSH_AUTH_SOCK: pulumi-command dials the agent whenever the variable is set and
# fails every remote step when that socket is gone (a stale one from a closed session), before it tries
# the lab's key (pulumi-command 1.2.1 remote/connection.go SShConfig). The steps use labs-k8s:sshPrivateKey only.
NO_AGENT := env -u SSH_AUTH_SOCK

# The start of up's and preview's last line: `layer_targets`, a bash array of `--target=URN`, one
# per line the targets command prints (empty without LAYER). An assignment's status is its command
# substitution's, so a wrong LAYER stops the recipe (-e) with the targets command's message.
LAYER_TARGETS = layer_targets=(); if [ -n '$(LAYER)' ]; then \
  urns=$$($(PY) -m components targets --stack '$(STACK)' '$(LAYER)'); \
  while read -r urn; do layer_targets+=("--target=$$urn"); done <<< "$$urns"; fi;
# A wrong LAYER is refused before the checks, which may create the stack.
LAYER_KNOWN = @[ -z '$(LAYER)' ] || $(PY) -m components targets --stack '$(STACK)' '$(LAYER)' >/dev/null

# Before the virtualenv and the CLI: which stack (no default, see STACK above).
stack-named:
	@if [ -z "$(STACK)" ]; then \
	  echo "make $(or $(MAKECMDGOALS),up): which stack? STACK is not set (a new shell forgets \`export STACK\`):" >&2; \
	  echo "    export STACK=<your site's stack>      # README, \"Your first lab\", step 3" >&2; \
	  found=$$(ls Pulumi.*.yaml 2>/dev/null | sed -n 's/^Pulumi\.\(.*\)\.yaml$$/\1/p' | { grep -vx labs || true; } | tr '\n' ' '); \
	  [ -z "$$found" ] || echo "  Stack files in this checkout: $$found" >&2; \
	  exit 2; \
	fi

# After a failed `pulumi up` or `destroy`: what to do (docs/runbook.md, "When a step fails half-way").
AGAIN_HINT = || { rc=$$?; echo "make $@: pulumi $@ failed (exit $$rc). Every step is guarded and safe to run again: fix what the first error above names (a failed step prints the command that collects its logs; a step whose SSH session was cut, with EOF, a reset or no exit status, lost only its machine or balancer), then run make $@ again (docs/runbook.md, \"When a step fails half-way\")." >&2; exit $$rc; }

# Before the Pulumi CLI runs: is it installed and logged in, which backend and stack, does the
# stack exist (up/preview create it, destroy never does), are its settings complete
# (components/tools/first_run.py). Each problem comes with the command that fixes it.
up: stack-named venv
	$(LAYER_KNOWN)
	$(PY) -m components check --stack $(STACK) --for up
	$(LAYER_TARGETS) $(USER_ARGS) $(NO_AGENT) pulumi up --stack $(STACK) "$${layer_targets[@]}" "$${user_args[@]}" $(AGAIN_HINT)

preview: stack-named venv
	$(LAYER_KNOWN)
	$(PY) -m components check --stack $(STACK) --for preview
	$(LAYER_TARGETS) $(USER_ARGS) $(NO_AGENT) pulumi preview --stack $(STACK) --diff "$${layer_targets[@]}" "$${user_args[@]}"

# --refresh: `pulumi destroy` alone trusts the state, and the vSphere provider's delete of a VM that
# is already gone from vCenter fails ("cannot locate virtual machine with UUID"), while its read
# marks such a VM gone (terraform-provider-vsphere resourceVSphereVirtualMachineDelete / Read,
# virtualmachine.UUIDNotFoundError). Reading first lets a destroy finish with a node already gone.
destroy: stack-named venv
	@if [ -n '$(LAYER)' ]; then \
	  echo "make destroy: LAYER is for up and preview; destroy removes every resource of the stack" >&2; \
	  echo "  (one resource: make destroy ARGS='--target URN')" >&2; exit 2; fi
	$(PY) -m components check --stack $(STACK) --for destroy
	$(USER_ARGS) $(NO_AGENT) pulumi destroy --stack $(STACK) --refresh "$${user_args[@]}" $(AGAIN_HINT)

render: venv
	$(PY) -m components render --stack $(or $(STACK),labs) --out render

system-deps:
	bash scripts/install-test-deps.sh

# On a laptop without root the vcsim tests skip with a reason; under CI=true a failed build fails.
# Not echoed (@): make printed the recipe, so every run showed "vcsim could not be built here".
vcsim: system-deps
	@bash tests/tools/build_vcsim.sh >/dev/null || { [ "$${CI:-}" != true ] && \
	  echo "vcsim could not be built here; its tests will skip (they fail under CI=true)" >&2; }

# The real Pulumi CLI and the plugins the Go module proxy serves, built from Go modules
# (tests/tools/toolchain/manifest.json says which, at which version, and which are refused).
toolchain: system-deps
	@bash tests/tools/build_toolchain.sh >/dev/null || { [ "$${CI:-}" != true ] && \
	  echo "the Pulumi toolchain could not be built here; the real-engine tests will skip (they fail under CI=true)" >&2; }

# The real programs of a node (Kubernetes of each minor we support, etcd, CoreDNS, containerd, Flannel,
# ...), built from the Go module proxy (tests/tools/kube/manifest.json, tests/kube_programs.py).
kube: venv-dev system-deps
	@$(PY) -m tests.kube_programs build >/dev/null || { [ "$${CI:-}" != true ] && \
	  echo "the node programs could not be built here; the tests that run them will skip (they fail under CI=true)" >&2; }

# Two workers: the lab in a box beside the rest of the suite (tests/conftest.py says why).
test: venv-dev system-deps vcsim toolchain kube
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -n 2

# The lab in a box (tests/box_cli.py, README "Try it without a vCenter"): vcsim, the package
# mirror and a host per clone under $(BOX), then `make up` against them; box-down removes it all.
# No make prerequisites: box_cli checks root, Linux and the tools first, under the machine's
# python3, then runs the builds itself (one line each, their output to a log).
BOX ?= .box
box:
	@$(PYTHON) -m tests.box_cli up $(BOX)

box-down:
	@$(PYTHON) -m tests.box_cli down $(BOX)

# A shell in the box's namespace with the toolchain on PATH, its PULUMI_HOME and passphrase.
box-shell:
	@$(PYTHON) -m tests.box_cli shell $(BOX)

lint: venv-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	shellcheck $$(git ls-files '*.sh')

bench: venv-dev
	$(PY) bench/render_scaling.py
	$(PY) bench/lb_failover.py
	$(PY) bench/upgrade_chain.py

lock:
	$(PIP_ENV) $(PIP) install -q pip-tools
	$(PIP_ENV) $(VENV)/bin/pip-compile -q --generate-hashes --allow-unsafe --strip-extras \
	  --no-emit-index-url --no-emit-find-links -o requirements.txt requirements.in
	$(PIP_ENV) $(VENV)/bin/pip-compile -q --generate-hashes --allow-unsafe --strip-extras \
	  --no-emit-index-url --no-emit-find-links -o requirements-dev.txt requirements-dev.in
