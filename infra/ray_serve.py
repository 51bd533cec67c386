"""Ray Serve settings the resolve step counts with. Below resolve, so that it may read them;
the plan (infra/plan/serve_tuning.py) renders them into the RayService pods' environment.

Paths are relative to ``ray/`` in Ray 2.60.0's wheel; ``S/`` is ``ray/serve/_private/``.
"""

from __future__ import annotations

# Failed starts Serve allows a deployment per replica before DEPLOY_FAILED. Ray 2.60 takes
# min(deployment_config.max_constructor_retry_count, target replicas x
# RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT) (S/deployment_state.py `_failed_to_start_threshold`;
# the variable is read at import of S/constants.py, in the controller on the head: pod env),
# and a DEPLOY_FAILED app stays failed until its config changes (KubeRay resubmits nothing
# else). The plan sets both operands (infra.resolve ServedModelPlan.start_attempts), so this
# number per replica is the threshold. Waiting for a model folder is not a failed start
# (workloads/serve/wait.py), so what counts is a real failure: the engine's, a wait past its
# bound, a host lost while starting (spot). Three, Ray's default: two lost hosts are survived.
SERVE_START_ATTEMPTS_PER_REPLICA = 3
