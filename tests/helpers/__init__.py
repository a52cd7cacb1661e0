"""What tests share: the ranks of a distributed test and their checks (ranks), stand-ins (fakes), the training
CLI as a subprocess (cli). Tests import these, never each other."""
