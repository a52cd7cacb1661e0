"""Every all-reduce algorithm by name, built in or registered: the one place that maps names to algorithm classes.

It sits beside the algorithms (:mod:`npddp.comm.p2p`), below every communicator: ``auto``, ``hier``,
the tuner and :mod:`npddp.comm.backends` find algorithms here by name. Every entry is a (module, class)
pair below ``npddp.comm``, imported only when its name is used.
"""

from __future__ import annotations

import importlib

from npddp.util import plugins

#: Hand-written all-reduce algorithms over point-to-point messages: name -> (module, class).
ALGORITHMS = {
    "ring": ("p2p.ring", "Ring"),
    "naive": ("p2p.naive", "Naive"),
    "rd": ("p2p.rd", "RecursiveDoubling"),
    "rabenseifner": ("p2p.rabenseifner", "Rabenseifner"),
    "tree": ("p2p.tree", "Tree"),
}
#: Algorithms among the ranks of one node through shared memory: name -> (module, class).
NODE_ALGORITHMS = {"shm": ("node.shm", "Shm")}
#: Every backend ``npddp.comm.create`` accepts.
BACKENDS = ("mpi", *ALGORITHMS, "auto", "shm", "hier")
#: MPI's own all-reduce (the library's default selection): ``auto``'s candidate where the transport is MPI
#: (:mod:`npddp.comm.compose.library`), named so in its tables and tuning files.
LIBRARY = "mpi"


def _load(module: str, name: str):
    """``npddp.comm.<module>.<name>``, imported on first use."""
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def algorithm(name: str):
    """The all-reduce algorithm class called ``name``; ValueError naming the valid ones otherwise."""
    table = {**ALGORITHMS, **NODE_ALGORITHMS}
    if name in REGISTERED or (name not in table and discover() and name in REGISTERED):
        return REGISTERED[name]
    try:
        return _load(*table[name])
    except KeyError:
        raise ValueError(f"unknown all-reduce algorithm {name!r}; valid: {', '.join([*table, *REGISTERED])}") from None


# --- algorithms registered at run time: register_algorithm, --plugin MODULE, entry points ----
#: Users' all-reduce algorithms: name -> class (``__init__(ctx)``, ``start(...)``, maybe ``cost``).
REGISTERED: dict = {}
#: The entry-point group an installed package names its algorithms in (``name = module:function``).
ENTRY_POINT_GROUP = "npddp.algorithms"
_discovered: list = []  # [True] once the entry points were loaded


def register(name: str, cls) -> None:
    """Add algorithm class ``cls`` as ``name`` (:func:`npddp.comm.algorithm.register_algorithm` builds it)."""
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"algorithm name {name!r} must be a Python identifier (letters, digits, _)")
    if name in BACKENDS or name in NODE_ALGORITHMS:
        raise ValueError(f"algorithm name {name!r} is built in; choose another (taken: {', '.join(BACKENDS)})")
    REGISTERED[name] = cls


def discover() -> bool:
    """Load the algorithms installed packages declare under :data:`ENTRY_POINT_GROUP` (once); True."""
    if not _discovered:
        _discovered.append(True)
        from importlib.metadata import entry_points
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            ep.load()  # importing the module registers the algorithm
            if ep.name not in REGISTERED:
                raise ValueError(f"entry point {ep.name} = {ep.value} (group {ENTRY_POINT_GROUP}) was imported "
                                 f"but registered no algorithm called {ep.name!r}")
    return True


#: Import the modules ``--plugin`` names (dotted names or ``.py`` paths): the one loader, :func:`npddp.util.plugins.load`.
load_plugins = plugins.load


def backend_names() -> tuple:
    """Every backend name ``create`` accepts now: the built-in ones, then the registered ones."""
    discover()
    return (*BACKENDS, *REGISTERED)


def costed() -> tuple:
    """Registered algorithms that declare a cost (``auto``, the tuner and the projection consider them)."""
    discover()
    return tuple(n for n, cls in REGISTERED.items() if callable(getattr(cls, "cost", None)))
