"""Code that runs inside the vLLM process of a business line's inference pods.

Not an agent (``cluster_agents`` run beside vLLM) and not a tool: each module here is shipped as a
single file in a ConfigMap, put on the vLLM container's ``PYTHONPATH`` and loaded by vLLM itself
(``--kv-transfer-config``'s ``kv_connector_module_path``). So each module is self-contained: the
standard library, plus what the pinned ``lmcache/vllm-openai`` image already holds (vLLM, LMCache,
``prometheus_client``), imported only where the module runs inside vLLM, so that the project's
venv (which has neither vLLM nor LMCache) can import and unit-test the rest.

* :mod:`vllm_plugins.l2_gate`: the L2 gate, a KV connector that stops LMCache lookups while the
  line's L2 mount does not answer (docs/l2-cache.md, "When the L2 hangs: the L2 gate").
"""
