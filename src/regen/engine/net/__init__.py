"""Network helpers shared by the backends."""
