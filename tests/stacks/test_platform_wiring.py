"""How the stacks fit together: ids, environments, deployment order, no lookups at synth."""

from __future__ import annotations

import json

import stacks


def test_stack_ids_follow_the_naming_scheme(platform, project) -> None:
    names = [s.stack_name for s in platform.all()]
    assert names[:6] == ["kvcache-network", "kvcache-eks", "kvcache-hyperpod", "kvcache-addons", "kvcache-l2-cache",
                         "kvcache-observability"]
    assert names[6:] == [f"kvcache-line-{line.name}" for line in project.business_lines]
    assert {"kvcache-line-rag-assistant", "kvcache-line-research-reasoning"} <= set(names)
    assert [s.node.id for s in platform.all()] == names
    assert set(platform.business_lines) == {line.name for line in project.business_lines}
    assert stacks.stack_ids(project)["line-rag-assistant"] == "kvcache-line-rag-assistant"


def test_every_stack_has_the_configured_explicit_environment(platform, project) -> None:
    for stack in platform.all():
        assert stack.account == project.platform.account, stack.stack_name
        assert stack.region == project.platform.region, stack.stack_name


def test_deployment_order_network_eks_hyperpod_addons_l2_lines(platform) -> None:
    def deps(stack) -> set[str]:
        return {d.stack_name for d in stack.dependencies}

    assert deps(platform.network) == set()
    assert "kvcache-network" in deps(platform.cluster)
    assert "kvcache-eks" in deps(platform.hyperpod)
    assert "kvcache-hyperpod" in deps(platform.addons)
    assert "kvcache-addons" in deps(platform.l2_cache)
    for line in platform.business_lines.values():
        assert {"kvcache-addons", "kvcache-l2-cache"} <= deps(line), line.stack_name


def test_synthesis_made_no_context_lookups_and_wrote_no_placeholder_zone(synthesized) -> None:
    manifest = json.loads((synthesized.outdir / "manifest.json").read_text())
    assert "missing" not in manifest, manifest.get("missing")
    for path in synthesized.outdir.glob("*.json"):
        assert "dummy1" not in path.read_text(), path.name


def test_feature_flags_come_from_cdk_json(synthesized) -> None:
    context = stacks.cdk_json_context()
    assert context["@aws-cdk/aws-eks:useNativeOidcProvider"] is True
    assert context["@aws-cdk/core:defaultCrossStackReferences"] == "strong"
    app = synthesized.app
    for key, value in context.items():
        assert app.node.try_get_context(key) == value, key


def test_cdk_json_runs_the_app_from_the_venv() -> None:
    config = json.loads((stacks.REPO_ROOT / "cdk.json").read_text())
    assert config["app"] == ".venv/bin/python app.py"
    assert not any(k.startswith(("availability-zones:", "vpc-provider:", "ami:")) for k in config["context"])



def test_line_endpoints_wait_for_the_operator_and_policy_engine(platform) -> None:
    """The line's InferenceEndpointConfig needs the operator's CRD; its Policy needs Kyverno's."""
    for line in platform.business_lines.values():
        assert platform.addons.inference_operator in line.endpoint.node.dependencies, line.stack_name
        if line.line.cache.l2_enabled:
            assert platform.l2_cache.kyverno in line.storage.node.dependencies, line.stack_name
