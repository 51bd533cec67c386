"""Entry point `pulumi up` runs (Pulumi.yaml: runtime python, this directory)."""

from infra.program import main

main()
