"""The engine's pure-Python core: requests are scheduled against a token budget and a KV block pool.
Nothing here imports torch, so every invariant can be tested on the CPU in milliseconds."""
