"""Thin Pulumi components: each wraps one concept's plan into resources, children parented.

Provider modules load lazily: each component imports only the submodules it uses
(`pulumi_gcp.container`, not `pulumi_gcp`), which is what a Pulumi program's start-up costs.
"""
