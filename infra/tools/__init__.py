"""The tools that read the deploy pipeline and never recompute it: `park render` (render),
`park validate` (validate: schemas; checks: TPU rules on manifests, read by manifests/),
`park cost` (cost), `park local` (local/), README's generated sections (docs), and the CLI that
fronts them (cli)."""
