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
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION := 1

.PHONY: setup synth test manifests bench docs clean

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

## make manifests: the same cdk8s charts as plain YAML in dist/, for GitOps or kubectl users.
manifests: setup
	$(PY) scripts/manifests.py --config config --out dist

## make bench: synthesis time and peak memory for 1, 10 and 50 business lines (JSON).
bench: setup
	$(PY) scripts/bench_synth.py

## make docs: regenerate README.md's configuration reference from the pydantic models.
docs: setup
	$(PY) -m platform_config.reference README.md

clean:
	rm -rf cdk.out dist .pytest_cache
