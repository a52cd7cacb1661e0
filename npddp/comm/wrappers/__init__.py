"""Communicators that wrap another: cross-rank call checks (debug) and a background progress thread."""
