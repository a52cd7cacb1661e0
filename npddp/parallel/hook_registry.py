"""Comm hooks by name: the registry ``--comm-hook NAME`` reads, and the built-in hooks registered through it.

A factory is ``build(comm, settings) -> (state, hook)`` with a one-line help text;
``settings`` carries the CLI's hook options as attributes (``topk_ratio``, ``powersgd_rank``,
``powersgd_start_iter``, ``seed``). A ``--plugin`` module registers its own with
:func:`register_comm_hook_factory` when imported, and ``--comm-hook`` then accepts its name::

    from npddp.parallel.hook_registry import register_comm_hook_factory
    from npddp.parallel.hooks import allreduce_prescaled

    register_comm_hook_factory("prescaled", lambda comm, settings: (comm, allreduce_prescaled),
                               "divide by the size, then sum")
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, NamedTuple

from npddp.parallel.hooks import TopKState, allreduce_hook, fp16_compress_hook, topk_hook
from npddp.parallel.powersgd import PowerSGDState, powersgd_hook
from npddp.util.registry import Registry

__all__ = ["HOOKS", "HookFactory", "build", "build_comm_hook", "comm_hook_help", "comm_hook_names",
           "register_comm_hook_factory"]


class HookFactory(NamedTuple):
    """A registered comm hook: how to build ``(state, hook)`` and what ``--help`` says of it."""

    build: Callable[[Any, Any], tuple]
    help: str


#: Registered comm hooks by name, in registration order (the built-ins first).
FACTORIES = Registry("comm hook")


def register_comm_hook_factory(name: str, build: Callable[[Any, Any], tuple], help: str) -> None:
    """Offer ``build(comm, settings) -> (state, hook)`` as ``--comm-hook name``; ValueError for a bad or taken name."""
    FACTORIES.check(name)
    if not callable(build):
        raise TypeError(f"comm hook {name!r}: build must be a function build(comm, settings), got "
                        f"{type(build).__name__}")
    FACTORIES.add(name, HookFactory(build, str(help)))


def comm_hook_names() -> tuple[str, ...]:
    """Every registered comm hook name (the valid ``--comm-hook`` values)."""
    return FACTORIES.names()


def comm_hook_help() -> str:
    """``name (help), ...`` for every registered comm hook, the last joined by ``or``."""
    items = [f"{name} ({f.help})" for name, f in FACTORIES.items()]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def build_comm_hook(name: str, comm, settings) -> tuple:
    """``(state, hook)`` of the registered comm hook ``name``; ValueError naming the valid ones."""
    return FACTORIES.get(name).build(comm, settings)


def build(name: str, comm, *, topk_ratio: float = 0.01, powersgd_rank: int = 1, powersgd_start_iter: int = 10,
          seed: int = 0) -> tuple:
    """``(state, hook)`` for the registered hook ``name`` with these settings; ValueError naming the valid ones."""
    settings = SimpleNamespace(topk_ratio=topk_ratio, powersgd_rank=powersgd_rank,
                               powersgd_start_iter=powersgd_start_iter, seed=seed)
    return build_comm_hook(name, comm, settings)


register_comm_hook_factory("allreduce", lambda comm, s: (comm, allreduce_hook), "the average over ranks")
register_comm_hook_factory("fp16", lambda comm, s: (comm, fp16_compress_hook), "half-precision all-reduce")
register_comm_hook_factory("topk", lambda comm, s: (TopKState(comm, s.topk_ratio), topk_hook),
                           "largest --topk-ratio of each bucket, with error feedback")
register_comm_hook_factory("powersgd", lambda comm, s: (PowerSGDState(comm, rank=s.powersgd_rank,
                                                                      start_iter=s.powersgd_start_iter,
                                                                      seed=s.seed), powersgd_hook),
                           "rank --powersgd-rank matrices, with error feedback")

#: The built-in hooks' names.
HOOKS = comm_hook_names()
