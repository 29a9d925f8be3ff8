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
# jsii still runs on Node 20 (checked: synth and tests pass) but prints a boxed end-of-life
# notice on every process; silence it for Node 20 only, so a newer unsupported Node still warns.
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20

.PHONY: setup synth test test-lmcache manifests bench docs clean

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet -r requirements-dev.txt
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

setup: $(VENV)/.installed node_modules/.installed

## make synth: validate config/, then `cdk synth` every stack into cdk.out/ (no AWS access needed).
synth: setup
	rm -rf cdk.out
	$(CDK) synth --quiet --no-notices --no-version-reporting > /dev/null
	@echo "cdk.out/: $$(ls cdk.out/*.template.json | wc -l) templates"

## make test: the whole test suite (config, stacks, charts, tools, cfn-lint, cdk-nag).
test: setup
	$(PY) -m pytest

## make test-lmcache: the real-LMCache tier (tests_lmcache/): LMCache from PyPI on CPU, one process
## per pod, configured from the rendered admission policy; then the fs:// throughput benchmark.
## Own virtualenv .venv-lmcache (about 1.5 GB). torch goes in first and alone: installed after
## lmcache it would come as PyPI's CUDA build. Where pip has no CPU build of torch at hand,
## pass options that select one in TORCH_PIP_ARGS (e.g. PyTorch's CPU package index).
LMCACHE_VENV := .venv-lmcache
TORCH_PIP_ARGS ?=
$(LMCACHE_VENV)/.installed: requirements-lmcache.txt constraints-lmcache.txt
	$(PYTHON) -m venv $(LMCACHE_VENV)
	$(LMCACHE_VENV)/bin/pip install --quiet $(TORCH_PIP_ARGS) "$$(grep -E '^torch==' requirements-lmcache.txt)"
	$(LMCACHE_VENV)/bin/pip install --quiet -r requirements-lmcache.txt
	touch $@

test-lmcache: setup $(LMCACHE_VENV)/.installed
	$(LMCACHE_VENV)/bin/python -m pytest tests_lmcache -p no:cacheprovider
	$(LMCACHE_VENV)/bin/python -m tests_lmcache.bench_fs

## make manifests: the same cdk8s charts as plain YAML in dist/, for GitOps or kubectl users.
## The Curvine volume ID comes from CURVINE_VOLUME_ID or cdk-outputs.json (cdk deploy --outputs-file).
manifests: setup
	$(PY) scripts/manifests.py --config config --out dist $(if $(wildcard cdk-outputs.json),--outputs-file cdk-outputs.json)

## make bench: synthesis time and peak memory for 1, 10 and 50 business lines (JSON).
bench: setup
	$(PY) scripts/bench_synth.py

## make docs: regenerate README.md's configuration reference from the pydantic models.
docs: setup
	$(PY) -m platform_config.reference README.md

clean:
	rm -rf cdk.out dist .pytest_cache
