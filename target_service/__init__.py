"""The target model service: verifies every sequence's proposals in one ragged forward."""
