"""The stack spec: typed `park:*` / `gcp:*` keys (models), how they are read (read), errors."""

from infra.schema.errors import ConfigError, ConfigProblem
from infra.schema.models import StackConfig

__all__ = ["ConfigError", "ConfigProblem", "StackConfig"]
