"""Checkpoints, a library layer: the file (fileformat), what it holds over ranks (state), sharded files (shardwrite, shardread)."""
