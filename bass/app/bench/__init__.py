"""Benchmarks and measurements (`bass bench ...`); results go to bench/results/."""
