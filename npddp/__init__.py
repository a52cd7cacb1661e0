"""npddp: Distributed Data Parallel training of NumPy neural networks over MPI."""

__version__ = "0.1.0"
