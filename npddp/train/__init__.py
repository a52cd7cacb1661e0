"""The training application: the loop (trainer), the CLI (cli/), checkpoints and resume (checkpoint/), the console (console/), evaluation and generation."""
