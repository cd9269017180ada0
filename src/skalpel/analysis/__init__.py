"""Analyses: pure functions from the trace model to small typed results, one module per question."""
