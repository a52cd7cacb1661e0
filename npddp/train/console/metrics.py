"""Training metrics: per-step rows gathered cheaply, per-epoch totals, and the HDF5 file rank 0 writes.

Every rank records its own numbers each step (:class:`StepRecorder`); at a flush (epoch end,
checkpoint) one all-reduce of ``(loss_sum, rows)`` per pending step turns them into the loss
of the global batch, so the hot loop makes no extra collective call. Timings are rank 0's.

File layout (rewritten whole, atomically, at every flush)::

    /            attrs: format="npddp-metrics", schema_version, the environment (world_size,
                 backend, mpi_library, versions, host, time_utc, ...), config (JSON) and
                 config.<field>, model, parameters, dataset, status
    /steps/<c>   one 1-D dataset per column c of STEP_COLUMNS, one row per optimizer step
    /epochs/<c>  one 1-D dataset per column c of EPOCH_COLUMNS, one row per epoch

so ``pd.DataFrame({k: f["steps"][k][:] for k in f["steps"]})`` reads a table. Each column
carries a ``doc`` attribute.
"""

from __future__ import annotations

import os

import numpy as np

from npddp.util.atomicfile import atomic_h5
from npddp.util.runinfo import SCHEMA_VERSION, read_attrs, write_attrs

FORMAT = "npddp-metrics"

#: name -> (dtype, description) of the per-step table.
STEP_COLUMNS = {
    "step": ("int64", "optimizer steps done since the start of the run, this one included"),
    "epoch": ("int64", "epoch of this step, from 1"),
    "batch": ("int64", "batch within the epoch, from 1"),
    "loss": ("float64", "training loss of the global batch (mean over every rank's rows)"),
    "lr": ("float64", "learning rate used by this step"),
    "samples": ("int64", "rows in the global batch"),
    "step_s": ("float64", "rank 0: wall time of the step, batch gathering included"),
    "forward_s": ("float64", "rank 0: forward pass"),
    "backward_s": ("float64", "rank 0: backward pass, communication issued during it included"),
    "comm_issue_s": ("float64", "rank 0: time inside communication calls made during backward"),
    "comm_exposed_s": ("float64", "rank 0: time waiting for communication after backward"),
    "optimizer_s": ("float64", "rank 0: optimizer step (and local-SGD averaging)"),
    "comm_calls": ("int64", "rank 0: collective calls"),
    "comm_bytes": ("int64", "rank 0: bytes all-reduced"),
}

#: name -> (dtype, description) of the per-epoch table.
EPOCH_COLUMNS = {
    "epoch": ("int64", "epoch, from 1"),
    "step": ("int64", "optimizer steps done at the end of the epoch"),
    "train_loss": ("float64", "mean training loss over the epoch's rows, all ranks"),
    "val_loss": ("float64", "mean validation loss, every validation row counted once"),
    "val_acc": ("float64", "validation accuracy, fraction in [0, 1]"),
    "samples": ("int64", "training rows processed by all ranks (sampler padding included)"),
    "val_samples": ("int64", "validation rows evaluated by all ranks"),
    "train_s": ("float64", "rank 0: wall time of the epoch's training steps"),
    "val_s": ("float64", "rank 0: wall time of validation"),
    "samples_per_s": ("float64", "samples / train_s"),
    "forward_s": ("float64", "rank 0: sum over the epoch's steps"),
    "backward_s": ("float64", "rank 0: sum over the epoch's steps"),
    "comm_issue_s": ("float64", "rank 0: sum over the epoch's steps"),
    "comm_exposed_s": ("float64", "rank 0: sum over the epoch's steps"),
    "optimizer_s": ("float64", "rank 0: sum over the epoch's steps"),
    "compute_share": ("float64", "(forward + backward - comm_issue + optimizer) / train_s"),
    "comm_share": ("float64", "(comm_issue + comm_exposed) / train_s: communication not hidden"),
    "comm_calls": ("int64", "rank 0: collective calls in the epoch"),
    "comm_bytes": ("int64", "rank 0: bytes all-reduced in the epoch"),
}

_TIMES = ("step_s", "forward_s", "backward_s", "comm_issue_s", "comm_exposed_s", "optimizer_s")
_COUNTS = ("comm_calls", "comm_bytes")

#: Running sums of the epoch in progress, saved in checkpoints so a resumed epoch reports the same.
TOTALS = ("loss_sum", "samples", *_TIMES, *_COUNTS)


class StepRecorder:
    """This rank's per-step numbers since the last flush."""

    def __init__(self):
        self._rows: list[tuple] = []

    def record(self, step: int, epoch: int, batch: int, loss: float, rows: int, lr: float,
               step_s: float, stats) -> None:
        """One step: its position, the local mean loss over ``rows`` rows, and DDP's StepStats."""
        self._rows.append((step, epoch, batch, loss * rows, rows, lr, step_s, stats.forward_s,
                           stats.backward_s, stats.comm_issue_s, stats.comm_exposed_s,
                           stats.optimizer_s, stats.comm_calls, stats.comm_bytes))

    def flush(self, reduce) -> dict[str, np.ndarray]:
        """Columns of the pending steps with global losses; ``reduce`` sums arrays over ranks.

        Collective: every rank calls it at the same step, with the same number of pending rows.
        """
        table = np.array(self._rows, dtype=np.float64).reshape(-1, 14)   # (k, 14)
        self._rows.clear()
        sums = np.asarray(reduce(table[:, 3:5])).reshape(-1, 2)           # (k, 2) global loss sum, rows
        cols = {"step": table[:, 0], "epoch": table[:, 1], "batch": table[:, 2],
                "loss": sums[:, 0] / np.maximum(sums[:, 1], 1), "lr": table[:, 5],
                "samples": sums[:, 1]}
        for i, name in enumerate(("step_s", "forward_s", "backward_s", "comm_issue_s",
                                  "comm_exposed_s", "optimizer_s", "comm_calls", "comm_bytes")):
            cols[name] = table[:, 6 + i]
        return {k: v.astype(STEP_COLUMNS[k][0]) for k, v in cols.items()}


def _running(total: float, values: np.ndarray) -> float:
    """``total`` plus ``values`` added one at a time, left to right, so how steps are grouped into
    flushes (checkpoints) never changes the bits of the sum."""
    return float(np.add.accumulate(np.concatenate([[total], np.asarray(values, dtype=np.float64)]))[-1])


def add_to_totals(totals: np.ndarray, cols: dict[str, np.ndarray]) -> None:
    """Add flushed step columns into the epoch's running sums (a TOTALS-long float64 array)."""
    totals[0] = _running(totals[0], cols["loss"] * cols["samples"])
    totals[1] = _running(totals[1], cols["samples"])
    for i, name in enumerate(_TIMES + _COUNTS):
        totals[2 + i] = _running(totals[2 + i], cols[name])


def epoch_row(epoch: int, step: int, totals: np.ndarray, val: np.ndarray, val_s: float) -> dict:
    """The epoch's table row from its running sums and the validation sums (loss, correct, rows)."""
    t = dict(zip(TOTALS, totals.tolist()))
    train_s = t["step_s"]
    compute = t["forward_s"] + t["backward_s"] - t["comm_issue_s"] + t["optimizer_s"]
    loss_sum, correct, rows = (float(v) for v in val)
    return {"epoch": epoch, "step": step,
            "train_loss": t["loss_sum"] / t["samples"] if t["samples"] else float("nan"),
            "val_loss": loss_sum / rows if rows else float("nan"),
            "val_acc": correct / rows if rows else float("nan"),
            "samples": int(t["samples"]), "val_samples": int(rows), "train_s": train_s,
            "val_s": val_s, "samples_per_s": t["samples"] / train_s if train_s > 0 else 0.0,
            **{k: t[k] for k in _TIMES[1:]},
            "compute_share": compute / train_s if train_s > 0 else 0.0,
            "comm_share": (t["comm_issue_s"] + t["comm_exposed_s"]) / train_s if train_s > 0 else 0.0,
            "comm_calls": int(t["comm_calls"]), "comm_bytes": int(t["comm_bytes"])}


class MetricsLog:
    """The run's step and epoch tables, held by rank 0 and written whole to HDF5."""

    def __init__(self):
        self.steps = {k: np.zeros(0, dtype=d) for k, (d, _) in STEP_COLUMNS.items()}
        self.epochs = {k: np.zeros(0, dtype=d) for k, (d, _) in EPOCH_COLUMNS.items()}

    def add_steps(self, cols: dict[str, np.ndarray]) -> None:
        """Append flushed step columns."""
        for k, (dtype, _) in STEP_COLUMNS.items():
            self.steps[k] = np.concatenate([self.steps[k], np.asarray(cols[k], dtype=dtype)])

    def add_epoch(self, row: dict) -> None:
        """Append one epoch row."""
        for k, (dtype, _) in EPOCH_COLUMNS.items():
            self.epochs[k] = np.concatenate([self.epochs[k], np.array([row[k]], dtype=dtype)])

    def write(self, path, attrs: dict) -> None:
        """Write the tables and ``attrs`` (environment, config, ...) to ``path``, atomically."""
        with atomic_h5(path) as f:
            write_attrs(f, attrs)
            f.attrs["format"] = FORMAT
            f.attrs["schema_version"] = SCHEMA_VERSION
            for group, table, columns in (("steps", self.steps, STEP_COLUMNS),
                                          ("epochs", self.epochs, EPOCH_COLUMNS)):
                g = f.create_group(group)
                for k, (_, doc) in columns.items():
                    g.create_dataset(k, data=table[k]).attrs["doc"] = doc

    @classmethod
    def resume(cls, path, steps_done: int, epochs_done: int) -> tuple["MetricsLog", str]:
        """The rows of an earlier metrics file up to a checkpoint's position, and a note ("" if all went well).

        Rows past the checkpoint (written by a run that went on after it) are dropped; a
        missing or unreadable file gives empty tables and a note saying so.
        """
        log = cls()
        if not os.path.exists(path):
            return log, f"--metrics {path} does not exist; it restarts at step {steps_done + 1}"
        try:
            data = read_metrics(path)
        except (OSError, KeyError, ValueError) as exc:
            return log, f"--metrics {path} could not be read ({exc}); it will be replaced, " \
                        f"starting at step {steps_done + 1}"
        keep = data["steps"]["step"] <= steps_done
        log.steps = {k: data["steps"][k][keep].astype(d) for k, (d, _) in STEP_COLUMNS.items()}
        keep = data["epochs"]["epoch"] <= epochs_done
        log.epochs = {k: data["epochs"][k][keep].astype(d) for k, (d, _) in EPOCH_COLUMNS.items()}
        return log, ""


def read_metrics(path) -> dict:
    """``{"attrs": {...}, "steps": {column: array}, "epochs": {column: array}}`` of a metrics file."""
    import h5py

    with h5py.File(path, "r") as f:
        attrs = read_attrs(f)
        if attrs.get("format") != FORMAT:
            raise ValueError(f"{path} is not an npddp metrics file (format attribute "
                             f"{attrs.get('format')!r}, expected {FORMAT!r})")
        out = {"attrs": attrs}
        for group, columns in (("steps", STEP_COLUMNS), ("epochs", EPOCH_COLUMNS)):
            missing = [k for k in columns if k not in f[group]]
            if missing:
                raise KeyError(f"{path}: /{group} lacks columns {missing}")
            out[group] = {k: f[group][k][:] for k in f[group]}
        return out
