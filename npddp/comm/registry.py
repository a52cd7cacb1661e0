"""Every backend and all-reduce algorithm by name: the one place that maps names to code.

Backends and algorithms never import each other; ``create``, ``auto`` and ``hier`` find what
they compose here, by name, and modules are imported only when a name is used (so a TCP-only
process never loads mpi4py). Every entry is a (module, class) pair below ``npddp.comm``, loaded
by name, so this module imports no backend and no backend module imports back into a circle.
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
#: Communicators other than the plain P2PCommunicator: name -> (module, communicator class).
_COMMUNICATORS = {"naive": ("p2p.naive", "NaiveCommunicator"), "auto": ("compose.auto", "AutoCommunicator"),
                  "shm": ("node.shm", "ShmCommunicator"), "hier": ("compose.hier", "HierCommunicator")}
#: Every backend ``npddp.comm.create`` accepts.
BACKENDS = ("mpi", *ALGORITHMS, "auto", "shm", "hier")


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


def node_group(comm, call):
    """Shared memory among all of ``comm``'s ranks, or None when they do not share one node."""
    from npddp.comm.node.memory import node_ids
    if comm.size < 2 or len(set(node_ids(comm))) > 1:
        return None
    return _load("node.allreduce", "NodeGroup")(comm, list(range(comm.size)), call)


def build(name: str, transport, timeout: float, tuning=None, shared_memory: bool = True):
    """The hand-written backend ``name`` (an algorithm, or ``auto``) over ``transport``.

    ``shared_memory=False``: ``auto`` never uses shared memory (hier's group across nodes, whose
    ranks lie on different nodes even where ``NPDDP_RANKS_PER_NODE`` pretends so on one machine).
    """
    if name in REGISTERED:
        return _load("communicators.p2p", "P2PCommunicator")(transport, REGISTERED[name], name, timeout)
    if name == "auto":
        return _load(*_COMMUNICATORS[name])(transport, timeout, tuning, shared_memory)
    if name in ("shm", "hier"):
        return _load(*_COMMUNICATORS[name])(transport, timeout)
    cls = _load(*_COMMUNICATORS.get(name, ("communicators.p2p", "P2PCommunicator")))
    return cls(transport, algorithm(name), name, timeout)


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
