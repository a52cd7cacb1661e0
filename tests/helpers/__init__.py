"""What tests share: the ranks of a distributed test and their checks (ranks), stand-ins (fakes), the training
CLI as a subprocess (cli, cli_zero, cli_split), jobs watched from outside and the one mpirun lookup (jobs), groups
for communicator tests (groups), the all-reduce cases every algorithm passes (allreduce_cases), ZeRO's tiny runs
(zero), the emulated cluster (cluster), benchmark arguments (bench). Tests import these, never each other nor a
conftest (tests/test_layout.py checks)."""
