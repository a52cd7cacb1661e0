"""The algorithm API's former address, kept so plugins that import it still work: :mod:`npddp.comm.algorithms.api`."""

from npddp.comm.algorithms.api import Cost, Peers, Request, block_bounds, register_algorithm

__all__ = ["Cost", "Peers", "Request", "block_bounds", "register_algorithm"]
