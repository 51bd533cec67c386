"""The serving workload: what runs inside the RayService, and the same app on a laptop's CPU.

The RayService's ``serveConfigV2`` uses Ray's own builder, ``ray.serve.llm:build_openai_app``,
directly; nothing here runs on the TPU pods. This package holds what surrounds it:

- ``validate``: check a ``serveConfigV2`` with Ray's own schema classes (no TPU needed).
- ``cpu_profile``: turn the TPU ``serveConfigV2`` into a CPU one, listing every change.
- ``tiny_model``: a tiny random-weight Llama built locally (no hub access needed).
- ``local``: deploy that CPU config to a local Ray Serve and print the endpoint.
"""
