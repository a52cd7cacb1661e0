"""Small helpers every layer may use: atomic files and run metadata."""
