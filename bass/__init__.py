"""BASS: batched speculative decoding as a service.

The installed package maps the repository's top-level folders into one namespace:
`bass.engine` (engine/: model runtime shared by both services), `bass.draft_service`,
`bass.target_service`, `bass.coordinator`, `bass.kernels`. See README.md, "Architecture".
"""

__version__ = "0.1.0"
