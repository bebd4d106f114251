"""Tensor parallelism over torch.distributed: the rank's group and collectives (parallel_state.py) and the
sharded layers (parallel_layers.py). The processes themselves are the engine's (engine/tp_executor.py)."""
