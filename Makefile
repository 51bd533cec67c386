# Developer shortcuts; CI runs .ci/run.
STACKS := $(patsubst stacks/Pulumi.%.yaml,%,$(wildcard stacks/Pulumi.*.yaml))

.PHONY: goldens docs test lint
goldens:  ## re-render every shipped stack into tests/golden/<stack>/ (commit the diff)
	@for s in $(STACKS); do rm -rf tests/golden/$$s && python -m infra.tools.cli render $$s --out tests/golden/$$s > /dev/null || exit 1; echo "tests/golden/$$s"; done

docs:  ## regenerate the docs' and README's generated tables and flowcharts (infra/tools/docs.py)
	python -m infra.tools.docs

test:
	pytest

lint:
	ruff check . && ruff format --check infra workloads tests benchmarks policy park_gke examples provider
