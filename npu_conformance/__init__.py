"""Machinery of the conformance suite: cards, weights, runners, metrics, reporting."""
