"""Every algorithm by collective and name, built in or registered: the one place that maps names to algorithm classes.

Each collective has its own :class:`~npddp.util.registry.Registry` of :class:`Algorithm` entries. The built-in
algorithms are the modules of this folder, each registering itself with :func:`npddp.comm.register_algorithm`
when imported, as a user's plugin does; this module imports them all once, so adding one is adding its file.
``auto``, ``hier``, the tuner, the cost model, :mod:`npddp.comm.backends`, ``--backend``'s help and the docs'
tables read their names here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import NamedTuple

from npddp.util import plugins
from npddp.util.registry import Registry

#: The collectives an algorithm can implement (the key of every lookup here), each with its name in prose.
SPELLED = {"allreduce": "all-reduce", "allgather": "all-gather", "reduce_scatter": "reduce-scatter",
           "alltoall": "all-to-all", "broadcast": "broadcast"}
COLLECTIVES = tuple(SPELLED)
#: MPI's own all-reduce (the library's default selection): ``auto``'s candidate where the transport is MPI
#: (:mod:`npddp.comm.compose.library`), named so in its tables and tuning files.
LIBRARY = "mpi"
#: Backends built from other backends: ``auto`` (one algorithm per call), ``shm`` (one node), ``hier`` (both levels).
COMPOSED = ("auto", "shm", "hier")
#: Algorithms among the ranks of one node through shared memory: name -> (module, class) below ``npddp.comm``.
NODE_ALGORITHMS = {"shm": ("node.shm", "Shm")}
#: The entry-point group an installed package names its algorithms in (``name = module:function``).
ENTRY_POINT_GROUP = "npddp.algorithms"


class Algorithm(NamedTuple):
    """One registered algorithm of one collective."""

    name: str
    collective: str
    cls: type                   # __init__(ctx), start(call, src, dst, ufunc, result) -> Work
    cost: Callable | None       # (nbytes, size, chunk_bytes) -> Cost: the cost model's entry
    auto: bool                  # auto (and the tuner, the projection) may pick it
    builtin: bool               # one of this folder's modules
    help: str                   # one line for --backend's help and the docs' tables


#: Algorithms per collective, in registration order (the built-ins first).
REGISTRIES = {c: Registry(f"{SPELLED[c]} algorithm", reserved=(LIBRARY, *COMPOSED)) for c in COLLECTIVES}
_discovered: list = []  # [True] once the entry points were loaded
_importing_builtins: list = []  # [True] while this folder's modules are imported: what registers then is built in


def registry_of(collective: str) -> Registry:
    """The registry of ``collective``; ValueError naming the valid collectives."""
    if collective not in REGISTRIES:
        raise ValueError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    return REGISTRIES[collective]


def register(entry: Algorithm) -> None:
    """Add ``entry`` (:func:`npddp.comm.register_algorithm` builds it); a built-in name is never replaced."""
    registry = registry_of(entry.collective)
    known = registry.get(entry.name) if entry.name in registry else None
    if (known is not None and known.builtin) or entry.name in registry.reserved:
        taken = ", ".join([*registry.reserved, *(n for n, e in registry.items() if e.builtin)])
        raise ValueError(f"algorithm name {entry.name!r} is built in; choose another (taken: {taken})")
    registry.add(entry.name, entry, replace=not entry.builtin)   # a plugin imported again replaces its own


def unregister(name: str, collective: str = "allreduce") -> None:
    """Forget the registered algorithm ``name`` (a test's temporary one)."""
    registry_of(collective).remove(name)


def entries(collective: str = "allreduce") -> tuple:
    """Every :class:`Algorithm` of ``collective``: the built-ins, then the registered ones."""
    discover()
    return tuple(entry for _, entry in registry_of(collective).items())


def names(collective: str = "allreduce", *, builtin: bool | None = None, auto: bool | None = None) -> tuple:
    """Names of ``collective``'s algorithms, only built-in / registered ones or only ``auto``'s when asked."""
    if builtin is not True:   # built-ins need no entry points
        discover()
    return tuple(e.name for _, e in registry_of(collective).items()
                 if (builtin is None or e.builtin == builtin) and (auto is None or e.auto == auto))


def _load(module: str, name: str):
    """``npddp.comm.<module>.<name>``, imported on first use."""
    return getattr(importlib.import_module(f"npddp.comm.{module}"), name)


def algorithm(name: str, collective: str = "allreduce"):
    """The algorithm class called ``name`` (a node algorithm too); ValueError naming the valid ones otherwise."""
    registry = registry_of(collective)
    if name not in registry:
        discover()
    if name in registry:
        return registry.get(name).cls
    if collective == "allreduce" and name in NODE_ALGORITHMS:
        return _load(*NODE_ALGORITHMS[name])
    valid = [*registry, *(NODE_ALGORITHMS if collective == "allreduce" else ())]
    raise ValueError(f"unknown {registry.kind} {name!r}; valid: {', '.join(valid)}")


def discover() -> bool:
    """Load the algorithms installed packages declare under :data:`ENTRY_POINT_GROUP` (once); True."""
    if not _discovered:
        _discovered.append(True)
        from importlib.metadata import entry_points
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            ep.load()  # importing the module registers the algorithm
            if not any(ep.name in registry for registry in REGISTRIES.values()):
                raise ValueError(f"entry point {ep.name} = {ep.value} (group {ENTRY_POINT_GROUP}) was imported "
                                 f"but registered no algorithm called {ep.name!r}")
    return True


#: Import the modules ``--plugin`` names (dotted names or ``.py`` paths): the one loader, :func:`npddp.util.plugins.load`.
load_plugins = plugins.load


def backend_names() -> tuple:
    """Every backend name ``create`` accepts now: the built-in ones, then the registered all-reduce algorithms."""
    return (LIBRARY, *names(builtin=True), *COMPOSED, *names(builtin=False))


def backend_help() -> str:
    """What each backend is, for ``--backend``'s help: MPI's own, every all-reduce algorithm registered now, the rest."""
    ordered = sorted(REGISTRIES["allreduce"].items(), key=lambda item: not item[1].builtin)   # as backend_names
    listed = ", ".join(f"{name} ({entry.help})" if entry.help else name for name, entry in ordered)
    return (f"MPI's own collectives ({LIBRARY}); hand-written over --transport: {listed}, auto (picks one per call, "
            "shared memory on one node); shm (one node, shared memory), hier (shared memory per node, then the network)")


def costed() -> tuple:
    """Registered all-reduce algorithms that declare a cost (``auto``, the tuner and the projection consider them)."""
    return tuple(e.name for e in entries() if not e.builtin and e.cost is not None)


def importing_builtins() -> bool:
    """True while the built-in algorithms register (this folder's modules are being imported)."""
    return bool(_importing_builtins)


def _import_builtins() -> None:
    """Import every module of this folder: each built-in algorithm registers itself."""
    _importing_builtins.append(True)
    try:
        for module in pkgutil.iter_modules(importlib.import_module(__package__).__path__):
            importlib.import_module(f"{__package__}.{module.name}")
    finally:
        _importing_builtins.clear()


_import_builtins()
#: The built-in all-reduce algorithms over point-to-point messages, in registration order.
ALGORITHMS = tuple(name for name, entry in REGISTRIES["allreduce"].items() if entry.builtin)
#: Every built-in backend ``npddp.comm.create`` accepts.
BACKENDS = (LIBRARY, *ALGORITHMS, *COMPOSED)
