"""The model a run trains, and what the trainer knows of models: ``modeling`` (the one interface
the loop steps: a Hugging Face causal LM or a GPT preset), ``hf`` (find, read and check a hub
model's files) and ``hf_build`` (build it on the meta device, fill it with weights), ``gpt`` (the
GPT presets), ``tiny_llama`` (``park:tiny-llama``, built on the worker), ``model_rules`` (which
checkpoints the trainer trains; ``park validate`` asks the same rules) and ``loss`` (the chunked
cross-entropy each model's forward computes)."""
