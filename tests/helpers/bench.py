"""What the benchmark tests share: the smallest argument set of ``benchmarks/ddp.py``."""

#: One tiny model, a few steps: ``benchmarks/ddp.py`` in seconds.
DDP_TINY = ["--models", "tiny", "--batch", "4", "--steps", "2", "--warmup", "1"]
