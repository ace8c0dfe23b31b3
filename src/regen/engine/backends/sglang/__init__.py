"""SGLang behind the backend contract: `/generate` with locally rendered token ids (docs/sglang.md §11)."""
