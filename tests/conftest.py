"""Shared session fixtures: the example config, and the whole platform synthesized once.

Synthesizing the CDK app costs several seconds of jsii (Node) time, so it happens once per
test session; every stack test reads the same templates.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from platform_config.runtime import prepare_jsii_node
from tests.example_config import FIXTURE_CONFIG, copy_example_config

# Before any test module imports aws_cdk or cdk8s: no jsii end-of-life box on Node 20.
prepare_jsii_node()

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CONFIG = FIXTURE_CONFIG


@dataclass(frozen=True)
class SynthesizedPlatform:
    """The example platform after ``app.synth()``: the app, its stacks and the cloud assembly dir."""

    app: object  # aws_cdk.App
    stacks: object  # stacks.PlatformStacks
    outdir: Path


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    """A writable copy of the scenario configuration, for tests that break or change one thing."""
    return copy_example_config(tmp_path / "config")


@pytest.fixture(scope="session")
def project():
    """The scenario configuration (``tests/fixtures/config``), validated."""
    from platform_config import load_project

    return load_project(EXAMPLE_CONFIG)


@pytest.fixture(scope="session")
def synthesized(project, tmp_path_factory) -> SynthesizedPlatform:
    """The example platform built exactly as ``app.py`` builds it and synthesized once.

    cdk-nag is not registered as a synth-blocking plugin here (a finding would then error every
    test); ``tests/stacks/test_compliance.py`` runs the same AwsSolutions pack over this app.
    """
    import stacks

    outdir = tmp_path_factory.mktemp("cdk.out")
    app = stacks.new_app(outdir=str(outdir))
    built = stacks.build_platform(app, project)
    app.synth()
    return SynthesizedPlatform(app=app, stacks=built, outdir=outdir)


@pytest.fixture(scope="session")
def platform(synthesized):
    """``stacks.PlatformStacks`` of the example config (already synthesized)."""
    return synthesized.stacks


@pytest.fixture(scope="session")
def templates(synthesized) -> dict:
    """Stack id -> ``aws_cdk.assertions.Template`` for every stack of the example platform."""
    from aws_cdk.assertions import Template

    return {stack.stack_name: Template.from_stack(stack) for stack in synthesized.stacks.all()}
