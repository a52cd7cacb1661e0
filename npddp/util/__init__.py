"""Small helpers every layer may use: atomic files, run metadata, the process environment and its variables."""
