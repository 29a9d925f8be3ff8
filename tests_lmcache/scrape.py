"""What vLLM's ``/metrics`` would serve from a Prometheus multiprocess directory, printed as text.

Run as ``python -m tests_lmcache.scrape`` with ``PROMETHEUS_MULTIPROC_DIR`` set, in a process of
its own, standing in for the vLLM API server of the pod. vLLM 0.29.0 (the release inside
``lmcache/vllm-openai:v0.5.5``, docs/sources.md §13) mounts ``/metrics`` on
``get_prometheus_registry()`` (``vllm/entrypoints/serve/instrumentator/metrics.py``), which, when
``PROMETHEUS_MULTIPROC_DIR`` is set, is a fresh ``CollectorRegistry`` holding one
``prometheus_client.multiprocess.MultiProcessCollector`` (``vllm/v1/metrics/prometheus.py``).
vLLM is not installable here, so this module builds the same registry and prints
``generate_latest`` of it (the body ``make_asgi_app`` serves).
"""

from __future__ import annotations

import os
import sys

from prometheus_client import CollectorRegistry, generate_latest, multiprocess


def registry() -> CollectorRegistry:
    """vLLM's multiprocess registry; ValueError when ``PROMETHEUS_MULTIPROC_DIR`` is unset or not a
    directory (``MultiProcessCollector``; vLLM's API server would not start either)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") is None:
        raise ValueError("PROMETHEUS_MULTIPROC_DIR is not set: vLLM would serve its own process's registry only")
    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg)
    return reg


def main() -> int:
    sys.stdout.write(generate_latest(registry()).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
