"""Models: where they come from, the synthetic test model, GGUF metadata and the manifest."""
