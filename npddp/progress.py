"""What the training CLI prints: rank-0-only messages, a per-epoch progress bar, and line formats.

Only rank 0 prints. Messages go to stdout; warnings, errors and the progress bar to stderr.
The bar is drawn when stderr is a terminal (``progress="auto"``) or when asked for
(``"always"``), and redrawn at most ten times a second, so a run logged to a file gets no
per-step output by default.
"""

from __future__ import annotations

import sys
import time

#: When the progress bar is drawn.
PROGRESS_MODES = ("auto", "always", "never")


class Printer:
    """Rank-0 output: ``info`` (silenced by quiet), ``summary``, ``warn`` and ``error``."""

    def __init__(self, rank: int, quiet: bool = False, out=None, err=None, progress: str = "auto"):
        if progress not in PROGRESS_MODES:
            raise ValueError(f"progress must be one of {', '.join(PROGRESS_MODES)}, got {progress!r}")
        self.enabled = rank == 0
        self.quiet = quiet
        self.progress = progress
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

    def bar(self, total: int, label: str) -> "ProgressBar":
        """A progress bar over ``total`` steps, live on rank 0 as ``progress`` says (never when quiet)."""
        wanted = self.progress == "always" or (self.progress == "auto" and _isatty(self.err))
        live = self.enabled and not self.quiet and wanted
        return ProgressBar(total, label, self.err if live else None)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class ProgressBar:
    """``label [#####.....] done/total loss x.xxx ms/step`` redrawn in place; inert without a stream."""

    WIDTH = 30
    INTERVAL_S = 0.1

    def __init__(self, total: int, label: str, stream=None):
        self.total = max(int(total), 1)
        self.label = label
        self.stream = stream
        self._last = 0.0
        self._drawn = False

    def update(self, done: int, loss: float, step_s: float) -> None:
        """Show ``done`` of ``total`` steps (throttled; the last step always draws)."""
        if self.stream is None:
            return
        now = time.monotonic()
        if done < self.total and now - self._last < self.INTERVAL_S:
            return
        self._last = now
        filled = self.WIDTH * min(done, self.total) // self.total
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\r{self.label} [{bar}] {done}/{self.total} loss {loss:.4f} "
                          f"{step_s * 1e3:.1f} ms/step\x1b[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Erase the bar so the next line starts clean."""
        if self.stream is not None and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False


# ----------------------------------------------------------------------------- line formats

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
            f"comm {100 * row['comm_share']:3.0f}%  ({row['train_s']:.2f} s)")
