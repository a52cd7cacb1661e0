"""The lines the training CLI's rank 0 prints before and after training: header and summary.

The header names the world, the transport (and MPI library), BLAS threads, model, sync and
buckets (with ``--backend auto``: the algorithm it picks for them), data, optimizer and,
on ``--resume``, where the run continues.
"""

from __future__ import annotations

from npddp.comm.communicators.choice import describe, parse_algorithms
from npddp.optim import DEFAULT_LR
from npddp.train.config import Config
from npddp.train.console.printer import format_bytes
from npddp.util.runinfo import library_short


def header(cfg: Config, comm, ds, model_text: str, model, ddp, trainer, env: dict,
           thread_line: str, default_why: str = "", nodes=()) -> list[str]:
    """The lines rank 0 prints before training.

    ``default_why``: why the default backend is not mpi; ``nodes``: each rank's node (a line
    when there is more than one).
    """
    replicas = comm.size // (cfg.tp * cfg.pp)          # data replicas: the ranks of a split model share their rows
    per_rank = cfg.batch_size // replicas
    split = cfg.tp * cfg.pp > 1
    shares = f"{replicas} replica{'s' * (replicas > 1)}" if split else f"{comm.size}"
    count = ddp.whole_count() if split else model.num_parameters()   # a split rank holds only its part
    nbytes = count * model.num_bytes() // max(model.num_parameters(), 1) if split else model.num_bytes()
    scaled = f", --normalize {cfg.normalize}" if cfg.normalize != "none" else ""
    kind = transport_of(comm)
    where = f"MPI {library_short(env.get('mpi_library', '?'))}" if kind == "mpi" else "TCP sockets, no MPI"
    why = f" (default: {default_why})" if default_why else ""
    chosen = f" ({describe(parse_algorithms(cfg.algorithms))})" if cfg.algorithms else ""
    lines = [f"npddp.train: {comm.size} rank{'s' * (comm.size > 1)}, backend {cfg.backend}{chosen} over {kind}{why}, {where}",
             *([nodes_line(nodes)] if len(set(nodes)) > 1 else []),
             thread_line,
             f"model: {model_text}; {count:,} parameters ({cfg.dtype}, {format_bytes(nbytes)})",
             (f"sync: {cfg.sync}, {len(ddp.buckets)} bucket{'s' * (len(ddp.buckets) > 1)}, comm hook " if ddp.buckets or not split
              else "sync: none (one data replica), comm hook ")
             + f"{cfg.comm_hook}" + (f", local SGD every {cfg.local_sgd} steps" if cfg.local_sgd else "")
             + auto_picks(comm, ddp),
             (f"data: {ds.name}, {ds.n_train} train / {ds.n_val} val sequences of {cfg.context_length} tokens, "
              f"vocabulary {ds.num_classes}; batch {cfg.batch_size} = {shares} x {per_rank} sequences, "
              if cfg.model == "gpt" else
              f"data: {ds.name}, {ds.n_train} train / {ds.n_val} val rows of shape {tuple(ds.input_shape)}, "
              f"{ds.num_classes} classes{scaled}; batch {cfg.batch_size} = {shares} x {per_rank}, ")
             + f"{len(trainer.loader)} steps per epoch",
             f"optimizer: {cfg.optimizer}, lr {cfg.lr:g}"
             + (f" ({cfg.optimizer}'s default)" if cfg.lr == DEFAULT_LR.get(cfg.optimizer) else "")
             + (f", momentum {cfg.momentum}" if cfg.optimizer == "sgd" else "")
             + f", weight decay {cfg.weight_decay}; {cfg.epochs} epochs, seed {cfg.seed}"]
    if cfg.resume:
        lines.append(f"resuming {cfg.checkpoint} at epoch {trainer.epochs_done + 1}, batch "
                     f"{trainer.batches_done} done (step {trainer.step})")
    return lines


def nodes_line(nodes) -> str:
    """``nodes: 2 x 2 ranks (node0: 0,1; node1: 2,3)`` from each rank's node; ranges as ``0-7``."""
    members: dict = {}
    for rank, node in enumerate(nodes):
        members.setdefault(node, []).append(rank)
    sizes = {len(ranks) for ranks in members.values()}
    count = f"{len(members)} x {len(nodes) // len(members)} ranks" if len(sizes) == 1 else \
        f"{len(members)} with {len(nodes)} ranks"
    return f"nodes: {count} (" + "; ".join(f"node{i}: {_ranks_text(r)}" for i, r in enumerate(members.values())) + ")"


def _ranks_text(ranks: list) -> str:
    """``0,1`` or ``0-7`` (runs of three or more consecutive ranks as ranges)."""
    parts, start = [], 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            run = ranks[start:i]
            parts.append(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ",".join(map(str, run)))
            start = i
    return ",".join(parts)


def transport_of(comm) -> str:
    """``mpi`` or ``tcp``: what carries ``comm``'s messages (MPI's own collectives: mpi)."""
    transport = getattr(comm, "transport", None)
    return getattr(transport, "name", "mpi")


def auto_picks(comm, ddp) -> str:
    """For ``--backend auto``: ``; auto picks ring for 3 buckets (cost model)``, naming what each bucket size gets."""
    pick = getattr(comm, "algorithm_for", None)
    if pick is None or not ddp.buckets:
        return ""
    counts: dict = {}
    for bucket in ddp.buckets:
        name = pick(bucket.buffer.nbytes, bucket.buffer.dtype)
        counts[name] = counts.get(name, 0) + 1
    chosen = ", ".join(f"{name} for {n} bucket{'s' * (n > 1)}" for name, n in counts.items())
    return f"; auto picks {chosen} ({'cost model' if comm.source == 'model' else comm.source})"


def summary(cfg: Config, status: str, trainer, trained: float, total: float) -> str:
    """The final line."""
    row = trainer.last_row
    text = (f"{'done' if status == 'complete' else 'stopped (--max-steps)'}: epoch {trainer.epochs_done}"
            f"/{cfg.epochs}, step {trainer.step}, {trained:.1f} s training, {total:.1f} s in all")
    if row is not None:
        text += f"; last val_acc {100 * row['val_acc']:.2f}%, val_loss {row['val_loss']:.4f}"
        text += trainer.tokens_per_s(row, sep=", ")
    for name in ("checkpoint", "metrics"):
        if getattr(cfg, name):
            text += f"; {name} {getattr(cfg, name)}"
    return text
