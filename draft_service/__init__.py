"""The draft model service: proposes k tokens per sequence from a small model."""
