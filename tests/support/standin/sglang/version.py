"""The SGLang release the stand-in claims to be (the simulator's shapes follow it)."""

__version__ = "0.5.23"
