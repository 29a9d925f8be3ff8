"""Typed configuration of the tiered KV cache platform (pydantic models, loader, instance facts).

Pure Python, no aws_cdk or cdk8s imports, so the CDK stacks, the cdk8s charts and the operator
tools in ``kv_tools`` all read the same validated config.
"""

from platform_config.instances import INSTANCE_TYPES, InstanceType, get_instance_type
from platform_config.loader import ConfigError, ConfigProblem, ProjectConfig, load_business_line, load_platform, load_project
from platform_config.models import BusinessLineConfig, PlatformConfig

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
