"""The real-LMCache test tier (``make test-lmcache``): LMCache from PyPI, CPU only, one process per pod.

Two interpreters take part. The project's ``.venv`` renders the charts and applies each line's
Kyverno Policy to an operator-rendered Pod (:mod:`tests_lmcache.export_env`); the tier's own
``.venv-lmcache`` (torch CPU + ``lmcache==LMCACHE_VERSION``, no project dependencies) runs the
tests, each "pod" a separate process (:mod:`tests_lmcache.pod`) configured only from that
exported env, with the L2 mount re-pointed at a temporary directory.
"""
