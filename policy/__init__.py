"""park-gke's policy pack (Pulumi CrossGuard): rules over what `pulumi preview` would create.

The rules are plain functions (`rules.RULES`), unit-tested against the recorded inputs of every
shipped stack (tests/policy/). `__main__.py` only turns them into a `PolicyPack`, because
constructing one starts the analyzer's gRPC server and blocks.
"""
