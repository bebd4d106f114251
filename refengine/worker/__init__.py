"""The worker side: per-request state keyed by request id, input building, forward and sampling."""
