"""Environment defaults for the jsii runtime: the Node.js process behind aws-cdk-lib and cdk8s.

Two defaults, each set only when the environment has no value of its own, before the first jsii
import starts Node (:func:`prepare_jsii_node`; ``stacks`` and ``k8s`` call it first thing, and this
module imports neither aws-cdk-lib nor cdk8s):

* ``JSII_NODE``: ``scripts/jsii_node.sh``, node with V8 flags that halve the CPU a synthesis costs
  (the script says which and why; docs/ci-and-tests.md, "Synthesis speed");
* the end-of-life notice of Node 20, silenced (below).

jsii prints a boxed end-of-life notice on every start under Node.js 20 (unsupported by jsii
since 2026-10-30; its own ``NodeRelease`` table in the jsii runtime, ``@jsii/check-node``:
docs/sources.md §7).
Through the Python bindings that box reaches stderr as ``b'!!  ...'`` byte-string lines.
This project documents Node.js 22 LTS or newer and still works on 20 (synthesis and the test
suite checked on 20.20), so the notice is silenced for Node 20 only: jsii reads
``JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION`` as a comma-separated list of major versions,
so another unsupported Node still warns. An explicit value in the environment wins.

"""

from __future__ import annotations

import os
from pathlib import Path

#: Node.js majors that still work (checked) but that jsii reports as end-of-life.
SILENCED_END_OF_LIFE_NODE_MAJORS = "20"
END_OF_LIFE_NOTICE_VARIABLE = "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"


def quiet_node_notices() -> None:
    """Default :data:`END_OF_LIFE_NOTICE_VARIABLE` to the checked majors (an existing value wins)."""
    os.environ.setdefault(END_OF_LIFE_NOTICE_VARIABLE, SILENCED_END_OF_LIFE_NODE_MAJORS)


#: The Node.js command jsii runs (node with two V8 flags; the script documents them).
JSII_NODE_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "jsii_node.sh"
JSII_NODE_VARIABLE = "JSII_NODE"


def prepare_jsii_node() -> None:
    """Set jsii's defaults: :func:`quiet_node_notices`, and ``JSII_NODE`` to :data:`JSII_NODE_SCRIPT`
    when it is unset and the script is executable (a checkout that lost its mode bits runs plain node)."""
    quiet_node_notices()
    if os.access(JSII_NODE_SCRIPT, os.X_OK):
        os.environ.setdefault(JSII_NODE_VARIABLE, str(JSII_NODE_SCRIPT))
