"""Training drafter heads for a target by self-distillation (`refengine train-drafter`)."""
