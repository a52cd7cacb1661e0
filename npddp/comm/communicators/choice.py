"""Which algorithm runs each collective besides the all-reduce: one chosen by name, or ``auto``'s pick per call.

A hand-written backend's all-reduce is its name (``ring``, ``rd``, ...); its other collectives take the
algorithm named for them in ``create(..., algorithms={"allgather": "bruck"})``, else the default below.
``auto`` prices every registered algorithm of the collective that allows it with the one cost model
(:mod:`npddp.comm.engine.cost`, the transport's constants) at the call's size and takes the cheapest;
every rank computes the same pick from the same (collective, bytes, world size, transport).
"""

from __future__ import annotations

from npddp.comm.algorithms import registry
from npddp.comm.engine.cost import MODEL

#: The collectives whose algorithm is chosen here, and the algorithm each runs unless told otherwise.
DEFAULTS = {"allgather": "ring", "reduce_scatter": "ring", "alltoall": "pairwise"}
#: The name that picks per call by the cost model.
AUTO = "auto"
_CACHE_SIZE = 256


def check_algorithms(algorithms) -> dict:
    """``algorithms`` (None or {collective: name}) checked against the registry; ValueError naming the valid ones."""
    if algorithms is None:
        return {}
    if not isinstance(algorithms, dict):
        raise TypeError(f"algorithms must be a dict {{collective: algorithm name}}, got {type(algorithms).__name__}")
    for collective, name in algorithms.items():
        if collective not in DEFAULTS:
            raise ValueError(f"no algorithm choice for collective {collective!r}; valid: {', '.join(DEFAULTS)}")
        valid = (AUTO, *registry.names(collective))
        if name not in valid:
            raise ValueError(f"unknown {registry.SPELLED[collective]} algorithm {name!r}; valid: {', '.join(valid)}")
    return dict(algorithms)


def parse_algorithms(text: str) -> dict:
    """``"allgather=bruck,reduce_scatter=halving"`` as {collective: name}, checked; "" is {}. ValueError naming
    the bad pair and the valid names."""
    chosen = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        collective, sep, name = (part.strip() for part in pair.partition("="))
        if not sep or not name:
            raise ValueError(f"{pair!r} is not COLLECTIVE=ALGORITHM, e.g. allgather=bruck; collectives: "
                             f"{', '.join(DEFAULTS)}")
        if collective in chosen:
            raise ValueError(f"{collective} is named twice in {text!r}")
        chosen[collective] = name
    return check_algorithms(chosen)


def describe(algorithms: dict) -> str:
    """``allgather=bruck, reduce_scatter=halving``: the chosen algorithms as a run's header shows them."""
    return ", ".join(f"{c}={n}" for c, n in algorithms.items())


class CollectiveChoice:
    """The algorithm of each collective for one communicator: fixed by name, or ``auto``'s per call."""

    def __init__(self, ctx, chosen: dict, default: str | None = None):
        self.ctx = ctx
        self.chosen = {c: chosen.get(c, default or DEFAULTS[c]) for c in DEFAULTS}
        self._built: dict = {}    # (collective, name) -> algorithm instance
        self._picks: dict = {}    # (collective, nbytes) -> name, auto's choices

    def name_for(self, collective: str, nbytes: int) -> str:
        """The algorithm that runs ``collective`` on ``nbytes`` (the whole vector, or the whole stacked output)."""
        name = self.chosen[collective]
        if name != AUTO:
            return name
        key = (collective, nbytes)
        pick = self._picks.get(key)
        if pick is None:
            if len(self._picks) >= _CACHE_SIZE:
                del self._picks[next(iter(self._picks))]
            pick = self._picks[key] = cheapest(collective, nbytes, self.ctx.size, self.ctx.transport.name,
                                               self.ctx.chunk_bytes)
        return pick

    def algorithm(self, collective: str, nbytes: int):
        """The algorithm instance that runs ``collective`` on ``nbytes`` bytes."""
        return self.named(collective, self.name_for(collective, nbytes))

    def named(self, collective: str, name: str):
        """The instance of ``collective``'s algorithm ``name`` over this communicator's context (built once)."""
        built = self._built.get((collective, name))
        if built is None:
            built = self._built[(collective, name)] = registry.algorithm(name, collective)(self.ctx)
        return built


def cheapest(collective: str, nbytes: int, size: int, transport: str, chunk_bytes: int) -> str:
    """The ``auto``-eligible algorithm of ``collective`` the cost model prices lowest (the first on a tie)."""
    alpha, beta, gamma = MODEL.get(transport, MODEL["tcp"])
    priced = [(entry.cost(nbytes, size, chunk_bytes).time(alpha, beta, gamma), i, entry.name)
              for i, entry in enumerate(registry.entries(collective)) if entry.auto]
    return min(priced)[2]
