"""The training CLI's glue: the run's steps (main), flags (parser), data (inputs), checks (validate), outputs."""
