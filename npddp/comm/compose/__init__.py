"""Communicators composed of others: ``auto`` (a model or a tuning table picks the algorithm), ``hier`` (node, then network)."""
