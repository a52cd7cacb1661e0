"""What the training CLI prints: rank-0-only messages, progress within an epoch, and line formats.

Only rank 0 prints. Messages and progress lines go to stdout; warnings, errors and the
progress bar to stderr. Progress (``--progress``):

* ``bar``: a tqdm bar per epoch on stderr (samples done, elapsed, samples/s, ETA, the loss);
* ``log``: one line every ``--log-every`` seconds on stdout, so a log file or a job under
  ``mpirun`` shows progress within an epoch::

      step 1200/1710  epoch 4/5 (51%)  loss 0.1234  118,000 samples/s  elapsed 0:10  ETA 0:04

* ``auto`` (the default): ``bar`` when stderr is a terminal, else ``log``; ``none``: neither.

``--quiet`` silences both. The loss shown is rank 0's mean over the steps since the last
update (the epoch lines report the loss over all ranks); with ``--pp`` rank 0 is the first
pipeline stage, which never sees the loss, so its lines leave the loss out.
"""

from __future__ import annotations

import sys
import time

from npddp.train.config import PROGRESS_MODES


class Printer:
    """Rank-0 output: ``info`` (silenced by quiet), ``summary``, ``warn``, ``error`` and progress."""

    def __init__(self, rank: int, quiet: bool = False, out=None, err=None, progress: str = "auto",
                 log_every: float = 10.0):
        if progress not in PROGRESS_MODES:
            raise ValueError(f"progress must be one of {', '.join(PROGRESS_MODES)}, got {progress!r}")
        if not log_every > 0:
            raise ValueError(f"log_every must be a number of seconds > 0, got {log_every!r}")
        self.enabled = rank == 0
        self.quiet = quiet
        self.progress_mode = progress
        self.log_every = float(log_every)
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr

    def _write(self, stream, text: str) -> None:
        if self.enabled:
            stream.write(text + "\n")
            stream.flush()

    def info(self, text: str) -> None:
        """A progress message (header, epoch lines), unless quiet."""
        if not self.quiet:
            self._write(self.out, text)

    def summary(self, text: str) -> None:
        """The final summary: printed even when quiet."""
        self._write(self.out, text)

    def warn(self, text: str) -> None:
        """``warning: <text>`` on stderr."""
        self._write(self.err, f"warning: {text}")

    def error(self, text: str) -> None:
        """``error: <text>`` on stderr."""
        self._write(self.err, f"error: {text}")

    def mode(self) -> str:
        """What this rank shows: ``bar``, ``log`` or ``none``."""
        if not self.enabled or self.quiet or self.progress_mode == "none":
            return "none"
        if self.progress_mode == "auto":
            return "bar" if _isatty(self.err) else "log"
        return self.progress_mode

    def progress(self, *, epochs: int, steps_per_epoch: int, total_steps: int, step: int,
                 batch: int) -> "Progress":
        """Progress of a run at optimizer step ``step`` of ``total_steps``, ``batch`` rows per step."""
        return Progress(self.mode(), self.out, self.err, epochs=epochs, steps_per_epoch=steps_per_epoch,
                        total_steps=total_steps, step=step, batch=batch, log_every=self.log_every)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """Progress through a run: a bar per epoch, timed lines, or nothing (mode ``none``)."""

    def __init__(self, mode: str, out, err, *, epochs: int, steps_per_epoch: int, total_steps: int,
                 step: int, batch: int, log_every: float = 10.0, clock=time.monotonic):
        self.mode, self.out, self.err = mode, out, err
        self.epochs, self.steps_per_epoch, self.batch = epochs, max(int(steps_per_epoch), 1), batch
        self.total_steps, self.first_step = total_steps, step
        self.log_every, self.clock = log_every, clock
        self.started = self.last = clock()
        self.step, self.epoch, self.batch_in_epoch = step, 0, 0
        self._bar = None
        self._loss_sum, self._steps, self._rows = 0.0, 0, 0

    def start_epoch(self, epoch: int, done: int) -> None:
        """Epoch ``epoch`` (from 0) begins with ``done`` of its batches already done."""
        self.epoch, self.batch_in_epoch = epoch, done
        if self.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=self.steps_per_epoch * self.batch, initial=done * self.batch,
                             desc=f"epoch {epoch + 1}/{self.epochs}", unit="sample", unit_scale=True,
                             file=self.err, leave=False, dynamic_ncols=True, mininterval=0.2,
                             smoothing=0.1)

    def update(self, loss: float | None) -> None:
        """One optimizer step of ``batch`` rows with rank 0's loss ``loss`` (None: rank 0 does not know it)."""
        self.step += 1
        self.batch_in_epoch += 1
        if loss is not None:
            self._loss_sum += loss
            self._steps += 1
        self._rows += self.batch
        if self._bar is not None:
            self._bar.update(self.batch)
            if self._steps >= 10 or (self._steps and self._bar.n >= self._bar.total):
                self._bar.set_postfix_str(f"loss {self._loss_sum / self._steps:.4f}", refresh=False)
                self._loss_sum, self._steps = 0.0, 0
        elif self.mode == "log":
            now = self.clock()
            if now - self.last >= self.log_every:
                self.out.write(self.line(now) + "\n")
                self.out.flush()
                self.last, self._loss_sum, self._steps, self._rows = now, 0.0, 0, 0

    def line(self, now: float) -> str:
        """The progress line for the steps since the last one."""
        rate = self._rows / (now - self.last) if now > self.last else 0.0
        elapsed = now - self.started
        done = self.step - self.first_step
        left = max(self.total_steps - self.step, 0)
        eta = format_duration(elapsed / done * left) if done else "?"
        share = 100.0 * min(self.batch_in_epoch, self.steps_per_epoch) / self.steps_per_epoch
        loss = f"  loss {self._loss_sum / self._steps:.4f}" if self._steps else ""   # none known: left out
        width = len(str(self.total_steps))
        return (f"step {self.step:>{width}}/{self.total_steps}  epoch {self.epoch + 1}/{self.epochs} "
                f"({share:.0f}%){loss}  {rate:,.0f} samples/s  elapsed "
                f"{format_duration(elapsed)}  ETA {eta}")

    def end_epoch(self) -> None:
        """Erase the epoch's bar so the epoch line starts clean."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._loss_sum, self._steps = 0.0, 0


# ----------------------------------------------------------------------------- line formats

def format_duration(seconds: float) -> str:
    """75.2 -> '1:15'; 3725 -> '1:02:05'."""
    s = int(round(max(seconds, 0.0)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def percent(part: float, whole: float) -> float:
    """100 * part / whole, 0 when whole is 0."""
    return 100.0 * part / whole if whole > 0 else 0.0


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def epoch_line(row: dict, epochs: int) -> str:
    """One line per epoch from a metrics epoch row."""
    return (f"epoch {row['epoch']:>{len(str(epochs))}}/{epochs}  train_loss {row['train_loss']:.4f}  "
            f"val_loss {row['val_loss']:.4f}  val_acc {100 * row['val_acc']:6.2f}%  "
            f"{row['samples_per_s']:9.0f} samples/s  compute {100 * row['compute_share']:3.0f}%  "
            f"comm {100 * row['comm_share']:3.0f}%  ({row['train_s']:.2f} s, val {row['val_s']:.2f} s)")
