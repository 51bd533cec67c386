"""`park local`: run.py orchestrates, profile.py holds the CPU changes to the RayJob,
ray_head.py supervises the local Ray head, outcome.py records what ran, console.py prints."""

from infra.tools.local.ray_head import LocalRay, LocalRunError, ray_auth_env
from infra.tools.local.run import run_local

__all__ = ["LocalRay", "LocalRunError", "ray_auth_env", "run_local"]
