"""The fault tier (``make test-faults``): the real-LMCache pods and the real L2 janitor on a FUSE
mount (:mod:`tests_faults.faultfs`) that the tests switch to hang, ENOTCONN, EIO, ENOSPC or slow
reads while in use (:mod:`tests_faults.harness`); docs/l2-cache.md, "The fault tier". Runs in the
real-LMCache tier's virtualenv (``.venv-lmcache``, plus PyPI ``mfusepy``) as root, with ``/dev/fuse``.
"""
