"""Environment defaults for the jsii runtime: the Node.js process behind aws-cdk-lib and cdk8s.

jsii prints a boxed end-of-life notice on every start under Node.js 20 (unsupported by jsii
since 2026-10-30; its own ``NodeRelease`` table in the jsii runtime, ``@jsii/check-node``:
docs/sources.md §7).
Through the Python bindings that box reaches stderr as ``b'!!  ...'`` byte-string lines.
This project documents Node.js 22 LTS or newer and still works on 20 (synthesis and the test
suite checked on 20.20), so the notice is silenced for Node 20 only: jsii reads
``JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION`` as a comma-separated list of major versions,
so another unsupported Node still warns. An explicit value in the environment wins.

The variable must be set before the first jsii import starts Node; ``stacks`` and ``k8s``
call :func:`quiet_node_notices` first thing (this module imports neither aws-cdk-lib nor cdk8s).
"""

from __future__ import annotations

import os

#: Node.js majors that still work (checked) but that jsii reports as end-of-life.
SILENCED_END_OF_LIFE_NODE_MAJORS = "20"
END_OF_LIFE_NOTICE_VARIABLE = "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"


def quiet_node_notices() -> None:
    """Default :data:`END_OF_LIFE_NOTICE_VARIABLE` to the checked majors (an existing value wins)."""
    os.environ.setdefault(END_OF_LIFE_NOTICE_VARIABLE, SILENCED_END_OF_LIFE_NODE_MAJORS)
