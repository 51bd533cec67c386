"""Reinforcement learning with verifiable rewards (GRPO): vLLM rollout engines and the trainer's
model as the learner, on one Ray cluster.

- ``grpo``: group-normalised advantages; the clipped policy-ratio loss, token-mean, k3 KL.
- ``rewards``: rewards as ``module:function`` callables; built-ins exact match, numeric, format.
- ``sync``: the weight-sync contract (policy versions, staleness bound, the vLLM worker
  extension that loads a published folder).
- ``rollout``: the vLLM engine (a Ray actor in a job) and the driver's pool of engines.
- ``learner``: log-probabilities under the trainer's DDP/FSDP2 model, the GRPO step, publishing.
- ``prompts``: prompts and reference answers from the trainer's data reader; scoring a round.
- ``config``: the run's flags (RLRunConfig), rendered by the stack's RayJob.
- ``loop``: one learner rank's GRPO loop (rank 0 drives the engines), checkpoints, export.
- ``launcher``: the learner as a Ray Train TorchTrainer; ``python -m workloads.rl`` runs it.
- ``toy``: the RL tests' task, one a random-init tiny model can learn;
- ``facts_task``: ``park local rl``'s task, the dev stack's 32 facts scored by exact match.

**Why no RL library.** The field's loops were read first (verl, OpenRLHF, TRL's GRPOTrainer,
SkyRL) and their formulas are followed here (each module names its source); none is used as a
dependency, because none fits Ray 2.60 + vLLM + torch_tpu without forking it:

- verl: its workers are its own Ray actors around FSDP/Megatron on CUDA (device mesh, NCCL
  process groups and CUDA IPC for the weight hand-off, ``torch.cuda`` calls throughout); TPU
  support is open pull requests, and it pins its own vLLM versions.
- OpenRLHF: Ray + DeepSpeed (CUDA), vLLM engines updated by NCCL broadcast or CUDA IPC through
  its worker wrapper.
- TRL's GRPOTrainer: a ``transformers.Trainer`` driven by Accelerate, not Ray Train; its vLLM
  sync is NCCL (server mode) or an in-process engine on the same GPU (colocate mode).
- SkyRL: Ray-based, FSDP/Megatron learners on CUDA, weight sync over NCCL or CUDA IPC.

The learner here is the project's own trainer (Ray Train, one worker per chip, FSDP2 on
torch_tpu or gloo on CPU), so the model loading, sharding, checkpointing and export are shared
with SFT; the parts RL adds are small (this package) and device-neutral. The weight hand-off
uses vLLM's own worker-extension and ``reload_weights`` API with a safetensors folder (see
``sync``), which works wherever vLLM and the trainer's exporter run.
"""
