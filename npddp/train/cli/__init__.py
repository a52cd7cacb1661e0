"""The training CLI's glue: the run's steps (main), data (inputs), checks (validate), output paths (outputs)."""
