"""mutations: named invariant mutations and the mutmut score gate."""
