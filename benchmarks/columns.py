"""The columns of every benchmark dump: declared in :mod:`npddp.results.columns` (installed with npddp), named here too."""

from npddp.results.columns import *  # noqa: F401,F403
