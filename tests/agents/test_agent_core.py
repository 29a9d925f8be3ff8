"""The in-cluster agents' shared core (:mod:`cluster_agents.agent_core`): its Kubernetes client's request.
The agents' own tests run the rest (HTTP server, serve loop, the client against a fake API server)."""

from __future__ import annotations

import urllib.request

from cluster_agents import agent_core


def test_in_cluster_pod_listing_sends_the_service_accounts_request(tmp_path, monkeypatch) -> None:
    """The janitor's and the canary's request: URL (an IPv6 host in brackets), the service account's
    token (read at the call) and CA, the timeout."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("tok\n")
    (sa / "ca.crt").write_text("")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    monkeypatch.setattr(agent_core, "SERVICE_ACCOUNT_DIR", sa)
    seen = []

    class Response:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, *args):
            return b'{"items": [{"metadata": {"name": "p"}}]}'

    def urlopen(request, context=None, timeout=None):
        seen.append((request.full_url, dict(request.header_items()), timeout, context))
        return Response()

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setattr("ssl.create_default_context", lambda cafile=None: ("context", cafile))
    assert agent_core.KubeApi.in_cluster(timeout_s=20).list_pods("rag") == [{"metadata": {"name": "p"}}]
    (url, headers, timeout, context), = seen
    assert url == "https://[fd00::1]:6443/api/v1/namespaces/rag/pods"
    assert headers["Authorization"] == "Bearer tok" and headers["Accept"] == "application/json"
    assert timeout == 20 and context == ("context", str(sa / "ca.crt"))

