"""Model runtime shared by the draft and target services: transformer, weight loading,
KV cache, ragged batches, sampling and speculative verification."""
