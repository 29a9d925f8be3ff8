"""Typed configuration of the tiered KV cache platform (pydantic models, loader, instance facts).

The bottom layer: it imports nothing of the project's other packages (``tests/test_layers.py``),
so the CDK stacks, the cdk8s charts, the observability code and the operator tools in
``kv_tools`` all read the same validated config. Checks that need a layer above (the planner's
fit) are passed in by that layer (:data:`platform_config.loader.LineCheck`).
"""

from platform_config.instances import INSTANCE_TYPES, InstanceType, get_instance_type
from platform_config.loader import ProjectConfig, load_business_line, load_platform, load_project
from platform_config.models import BusinessLineConfig, PlatformConfig
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
