"""Shared memory among the ranks of one node: segments, the node all-reduce, shm, and hier (node, then network)."""
