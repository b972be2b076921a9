"""Which model serves, where it is, whether to fall back or fetch it: one walk, no torch."""
