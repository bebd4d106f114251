"""refengine: a reference engine for async scheduling with speculative decoding."""
