"""The tools that read the deploy pipeline and never recompute it: `park render` (render;
flowchart: the picture of what `up` creates), `park validate` (validate: schemas; checks: TPU
rules on manifests, read by manifests/), `park cost` (cost), `park local` (local/), the
generated sections of docs/ and README (docs), and the CLI that fronts them (cli)."""
