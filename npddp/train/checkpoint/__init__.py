"""Training checkpoints: the file (fileformat), what it holds (state), sharded files (shardwrite, shardread), --resume (resume), and the script API (saving)."""
