"""What a run leaves behind in its storage: ``checkpointing`` (sharded DCP checkpoints, written
and restored the same for DDP and FSDP2) and ``export`` (the trained model as a Hugging Face
folder that transformers and vLLM load, with its completion marker)."""
