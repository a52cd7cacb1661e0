"""The communicator's command-line tools: the contract check (check) and the all-reduce tuner (tune)."""
