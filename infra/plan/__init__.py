"""The plan layer: pure functions from a validated StackConfig to what must exist.

Nothing here imports Pulumi. The Pulumi components wrap these plans; the offline render,
`park local`, the schema checks and the policy tests read the same plans. No fact is computed twice.
"""
