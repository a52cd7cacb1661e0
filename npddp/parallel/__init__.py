"""Data parallelism over a Communicator: DistributedDataParallel."""
