"""Expert parallelism: a GPT's mixture-of-experts layers with their experts spread over ``ep`` ranks.

The world of ``W`` ranks is data-parallel throughout: every rank takes its own sequences, and
the attention, embeddings, norms and routers are replicas averaged over all ``W`` ranks. Inside
that, consecutive blocks of ``ep`` ranks form expert groups: rank ``j`` of a group holds experts
``j * E/ep .. (j+1) * E/ep - 1`` of every MoE layer, and the ``W/ep`` ranks that hold the same
experts (one per group) form its expert-data group.

What moves, per MoE layer and step (see :class:`AllToAllExperts`):

* forward: an ``alltoall`` of the token counts per expert (ep x E/ep integers), then an
  ``alltoallv`` of the routed tokens (rows of d_model) to the ranks that hold their experts, and
  the reverse ``alltoallv`` of the expert outputs;
* backward: the same two ``alltoallv`` of gradients, in the other order;
* after backward: replica gradients all-reduced over the world, expert gradients over their
  expert-data group, both divided by ``W`` (each rank's loss is the mean over its own rows).

Routing, capacity and the load-balancing loss are per sequence (see :mod:`npddp.nn.moe`), so
the result equals one process holding every expert and the whole batch.
"""

from __future__ import annotations

import numpy as np

from npddp.nn.moe import Experts, MoE


def expert_owner(expert: int, num_experts: int, ep: int) -> int:
    """The rank of an expert group that holds ``expert``: contiguous blocks of ``num_experts // ep``."""
    return expert // (num_experts // ep)


def check_ep(num_experts: int, ep: int, world_size: int) -> None:
    """ValueError unless ``ep`` >= 1 divides both ``num_experts`` and ``world_size``."""
    if ep < 1 or num_experts % ep or world_size % ep:
        raise ValueError(f"ep must be >= 1 and divide both the number of experts {num_experts} and the world "
                         f"size {world_size}, got {ep}")


class AllToAllExperts:
    """A :class:`~npddp.nn.moe.MoE` dispatcher: tokens go to the rank holding their expert and come back."""

    def __init__(self, comm, num_experts: int):
        self.comm, self.num_experts = comm, num_experts
        self.per = num_experts // comm.size        # experts per rank
        self._plan = None                          # (send rows per rank, receive rows per (source, local expert))

    def _exchange(self, blocks: list, send_rows: np.ndarray, recv_rows: np.ndarray) -> np.ndarray:
        """alltoallv of row blocks (each (n, d)); counts in rows, sent as elements."""
        d = blocks[0].shape[1]
        buf = np.concatenate(blocks, axis=0) if blocks else np.zeros((0, d))
        out = self.comm.alltoallv(np.ascontiguousarray(buf).reshape(-1), send_rows * d, recv_rows * d)
        return out.reshape(-1, d)

    def _to_owners(self, per_expert: list) -> list:
        """Rows for every global expert here -> rows for each local expert from every source, in source order."""
        send_rows, recv = self._plan
        got = self._exchange(per_expert, send_rows, recv.sum(axis=1))
        edges = np.concatenate([[0], np.cumsum(recv.reshape(-1))])    # (source, local expert) blocks
        p = self.per
        return [np.concatenate([got[edges[s * p + i]:edges[s * p + i + 1]] for s in range(self.comm.size)])
                for i in range(p)]

    def _from_owners(self, per_local: list, d: int) -> list:
        """The reverse: each local expert's rows back to their sources -> rows for every global expert here."""
        send_rows, recv = self._plan
        p, size = self.per, self.comm.size
        starts = np.concatenate([np.zeros((p, 1), np.int64), np.cumsum(recv.T, axis=1)], axis=1)  # (p, size+1)
        blocks = [per_local[i][starts[i, s]:starts[i, s + 1]] for s in range(size) for i in range(p)]
        back = self._exchange(blocks or [np.zeros((0, d))], recv.sum(axis=1), send_rows)
        edges = np.concatenate([[0], np.cumsum(self._counts)])
        return [back[edges[e]:edges[e + 1]] for e in range(self.num_experts)]

    def forward(self, experts: Experts, inputs: list) -> list:
        """Expert outputs for this rank's tokens, by global expert index (collective over the expert group)."""
        counts = np.array([len(x) for x in inputs], np.int64)          # (E,) rows this rank sends each expert
        recv = self.comm.alltoall(counts.reshape(self.comm.size, self.per))   # (source, local expert)
        self._counts = counts
        self._plan = (counts.reshape(self.comm.size, self.per).sum(axis=1), recv.astype(np.int64))
        d = inputs[0].shape[1]
        local = self._to_owners(inputs)
        first = self.comm.rank * self.per
        outs = [experts[first + i].forward(x) for i, x in enumerate(local)]
        return self._from_owners(outs, d)

    def backward(self, experts: Experts, douts: list) -> list:
        """Gradients of this rank's expert inputs, by global expert index (collective over the expert group)."""
        d = douts[0].shape[1]
        local = self._to_owners(douts)
        first = self.comm.rank * self.per
        dxs = [experts._backward_child(experts[first + i], g) for i, g in enumerate(local)]
        return self._from_owners(dxs, d)


def moe_layers(model) -> list:
    """Every :class:`~npddp.nn.moe.MoE` in ``model``, in module order."""
    return [m for _, m in model.named_modules() if isinstance(m, MoE)]


def expert_parallel(model, ep_comm):
    """Keep this rank's experts of every MoE layer and route tokens through ``ep_comm``; returns ``model``."""
    layers = moe_layers(model)
    if not layers:
        raise ValueError("expert_parallel: the model has no MoE layers (build it with moe={...})")
    for layer in layers:
        check_ep(layer.num_experts, ep_comm.size, ep_comm.size)
        per = layer.num_experts // ep_comm.size
        layer.experts.keep(range(ep_comm.rank * per, (ep_comm.rank + 1) * per))
        layer.dispatcher = AllToAllExperts(ep_comm, layer.num_experts)
    return model


def is_expert_parameter(name: str) -> bool:
    """Whether parameter ``name`` belongs to an expert (held by some ranks) rather than a replica."""
    return ".experts." in f".{name}"


class ExpertDataParallel:
    """The engine of an expert-parallel model: ``train_batch``, ``step``, ``zero_grad``, ``state_dict``.

    ``world`` is every rank (replica gradients are averaged over it), ``expert_data`` the ranks
    holding the same experts (expert gradients are summed over it and divided by the world size).
    """

    def __init__(self, model, world, expert_data):
        self.module, self.world, self.expert_data = model, world, expert_data
        named = model.named_parameters()
        self._replica = [p for n, p in named if not is_expert_parameter(n)]
        self._expert = [p for n, p in named if is_expert_parameter(n)]
        self._flat = {id(group): np.zeros(sum(p.data.size for p in group), named[0][1].dtype)
                      for group in (self._replica, self._expert)}

    def parameters(self) -> list:
        """This rank's parameters: the replicas and its own experts."""
        return self.module.parameters()

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The model's forward on this rank's rows."""
        return self.module.forward(x)

    def backward(self, dout: np.ndarray) -> None:
        """The model's backward, then the gradients averaged (replicas over the world, experts over their group)."""
        self.module.backward(dout)
        for group, comm in ((self._replica, self.world), (self._expert, self.expert_data)):
            self._reduce(group, comm)

    def _reduce(self, group: list, comm) -> None:
        flat = self._flat[id(group)]
        at = 0
        for p in group:
            flat[at:at + p.data.size] = p.grad.reshape(-1)
            at += p.data.size
        if comm.size > 1:
            comm.allreduce(flat, "sum")
        flat /= self.world.size
        at = 0
        for p in group:
            p.grad[...] = flat[at:at + p.data.size].reshape(p.data.shape)
            at += p.data.size

    def train_batch(self, x: np.ndarray, y: np.ndarray, loss_fn) -> float:
        """Forward, loss, backward and gradient averaging on this rank's rows; this rank's loss."""
        loss = loss_fn.forward(self.forward(x), y)
        self.backward(loss_fn.backward())
        return float(loss)

    def step(self, optimizer) -> None:
        """Step ``optimizer`` on the averaged gradients."""
        optimizer.step()

    def zero_grad(self) -> None:
        """Zero every gradient."""
        self.module.zero_grad()

    def state_dict(self) -> dict:
        """This rank's parameters by name (its own experts only)."""
        return self.module.state_dict()


def whole_state_dict(model, ep_comm) -> dict:
    """The whole model's parameters by name on every rank of the expert group (collective over it): the
    replicas as held here, every expert gathered from the rank holding it; what one process would save."""
    state = model.state_dict()
    for prefix, layer in model.named_modules():
        if not isinstance(layer, MoE):
            continue
        names = [n for n, _ in layer.experts[layer.experts.held[0]].named_parameters()]
        for name in names:
            mine = np.stack([state.pop(f"{prefix}.experts.{e}.{name}") for e in layer.experts.held])
            every = ep_comm.allgather(mine)                          # (ep, per, *shape): rank j's experts
            for e, value in enumerate(every.reshape((-1,) + mine.shape[1:])):
                state[f"{prefix}.experts.{e}.{name}"] = value
    return state


def load_whole(model, state: dict) -> None:
    """Load a whole model's parameters (from any ``ep``, or one process) into this rank's part of ``model``."""
    mine = model.state_dict()
    missing = [n for n in mine if n not in state]
    if missing:
        raise KeyError(f"load_whole: the state lacks {len(missing)} parameters of this model, e.g. {missing[0]}")
    model.load_state_dict({n: state[n] for n in mine})
