"""The training application: the CLI, its config, checkpoints, resume, metrics, evaluation and console output."""
