"""Comparison of two dumps and of one computation against a benchmark (framework-neutral)."""
