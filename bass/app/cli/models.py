"""The model pair: `bass fetch-models` and `bass convert-gguf` (defined with their code in
bass/app/models/commands.py)."""

from __future__ import annotations

from bass.app.models.commands import convert_gguf_command, fetch_models_command

COMMANDS = [convert_gguf_command, fetch_models_command]
