"""How a run spreads over devices and hosts: ``scaling`` (Ray Train's ScalingConfig and
TorchConfig from a resolved config, on the driver), ``tpu_bridge`` (torch_tpu's slice
environment, built from Ray's worker layout), ``strategies`` (DDP or FSDP2 on tpu, cuda or cpu)
and ``runenv`` (where the loop runs: in Ray Train, or in a plain process group for the tests and
benchmarks)."""
