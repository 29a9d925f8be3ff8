"""Typed configuration of the tiered KV cache platform (pydantic models, loader, instance facts).

The bottom layer: it imports nothing of the project's other packages (``tests/test_layers.py``),
so the CDK stacks, the cdk8s charts, the observability code, the planner (``capacity``) and the
operator tools (``operator_tools``) all read the same validated config. Checks that need a layer
above (the planner's fit) are passed in by that layer (:data:`platform_config.loader.LineCheck`).

Modules: ``fields`` (the base model and the constrained types both files share),
``platform_models`` (``platform.yaml``), ``line_models`` (``business-lines/<name>.yaml``), ``loader``
(reading the directory and the checks across files), and the facts the checks need.
"""

from platform_config.instances import INSTANCE_TYPES, InstanceType, get_instance_type
from platform_config.line_models import BusinessLineConfig
from platform_config.loader import ProjectConfig, load_business_line, load_platform, load_project
from platform_config.platform_models import PlatformConfig
from platform_config.problems import ConfigError, ConfigProblem

__all__ = [
    "INSTANCE_TYPES",
    "BusinessLineConfig",
    "ConfigError",
    "ConfigProblem",
    "InstanceType",
    "PlatformConfig",
    "ProjectConfig",
    "get_instance_type",
    "load_business_line",
    "load_platform",
    "load_project",
]
