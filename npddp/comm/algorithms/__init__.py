"""Algorithms by collective: one file per built-in algorithm, the registry of them all, and the public API for your own."""
