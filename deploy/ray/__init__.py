"""Ray placement of the BASS services (`bass up` / `bass down`): bass.deploy."""
