"""The stack spec: typed `park:*` / `gcp:*` keys (models), how they are read (read), errors."""

from infra.spec.errors import ConfigError, ConfigProblem
from infra.spec.models import StackConfig

__all__ = ["ConfigError", "ConfigProblem", "StackConfig"]
