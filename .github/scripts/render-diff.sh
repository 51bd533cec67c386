#!/usr/bin/env bash
# Render every shipped stack offline (`park render`, Pulumi mocks, no credentials) and write
# to the job summary what the pull request changes against the base branch's goldens.
# Fails if this branch's own tests/golden/ is stale (run `make goldens` and commit the diff).
# Usage: render-diff.sh BASE_REF   (e.g. origin/main); needs a full-history checkout.
set -euo pipefail
base_ref=${1:?base ref, e.g. origin/main}
summary=${GITHUB_STEP_SUMMARY:-/dev/stdout}
out=$(mktemp -d)
base=$(mktemp -d)
max_chars=60000  # job summaries are capped at 1 MiB; keep each stack's diff readable

git archive "$base_ref" tests/golden 2>/dev/null | tar -x -C "$base" || true
stale=0
{
  echo "## park render: what this pull request changes"
  echo
  echo "Rendered offline with Pulumi mocks, compared with \`tests/golden/\` on \`$base_ref\`."
  echo
} >> "$summary"
for file in stacks/Pulumi.*.yaml; do
  stack=${file#stacks/Pulumi.}
  stack=${stack%.yaml}
  # bounded: park reads stack files with limits (size, depth, aliases); a fork's stack file
  # that still ran away would stop here, not hold the runner
  timeout 300 park render "$stack" --out "$out/$stack" > /dev/null
  # the images' content tag (a digest of workloads/, infra/images.py) is not a golden's staleness
  if ! diff -r -q -x .park-render.json -I 'src-[0-9a-f]\{16\}' "tests/golden/$stack" "$out/$stack" > /dev/null 2>&1; then
    echo "::error file=tests/golden/$stack::tests/golden/$stack is stale: run 'make goldens' and commit it"
    stale=1
  fi
  mkdir -p "$base/tests/golden/$stack"  # a new stack: everything is an addition
  changes=$(diff -ruN -x .park-render.json "$base/tests/golden/$stack" "$out/$stack" \
    | sed -E -e "s#$base/tests/golden/#base: #" -e "s#$out/#this PR: #" \
      -e 's#^((---|\+\+\+) .*)\t.*$#\1#' || true)
  {
    echo "### stack \`$stack\`"
    echo
    if [ -z "$changes" ]; then
      echo "No change."
    else
      echo "$(printf '%s\n' "$changes" | grep -c '^[-+][^-+]' || true) changed line(s)."
      echo
      echo '```diff'
      printf '%s\n' "${changes:0:$max_chars}"
      echo
      echo '```'
      [ "${#changes}" -le "$max_chars" ] || echo "(cut at $max_chars characters; render locally for the rest)"
    fi
    echo
  } >> "$summary"
done
exit "$stale"
