"""The training CLI's argparse parser, built from :class:`~npddp.train.config.Config`'s fields.

Each field is one ``--flag`` (underscores become dashes); its metadata gives the help text, the
choices and the ``[fixed on resume]``/``[from the checkpoint]`` marks. :func:`parse_config` turns
argv into a ``Config``, raising :class:`~npddp.train.config.ConfigError` (printed after
``error: ``) on a bad or unknown flag; it never communicates.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from npddp.comm import backend_names
from npddp.comm.algorithms.registry import backend_help
from npddp.parallel.hook_registry import comm_hook_help, comm_hook_names
from npddp.train.config import Config, ConfigError, flag
from npddp.util import plugins, variables

PROG = "python -m npddp.train"


def _help(f) -> str:
    """A field's help; ``--backend``'s and ``--comm-hook``'s name what plugins registered too."""
    if f.name == "comm_hook":
        return "DDP communication hook: " + comm_hook_help()
    if f.name == "backend":
        backend_names()   # installed packages' algorithms register first
        return "communication backend: " + backend_help() + "; may change on --resume"
    return f.metadata["help"]


def backend_name(text: str) -> str:
    """The value of ``--backend``: a built-in backend or one a ``--plugin`` module registered."""
    if text not in backend_names():
        raise ValueError(f"invalid choice: {text!r} (choose from {', '.join(backend_names())}; an algorithm "
                         "of your own needs --plugin MODULE, which registers it)")
    return text


def _show(value) -> str:
    """A default as it would be typed on the command line."""
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, bool):
        return "off" if not value else "on"
    return "none" if value is None else str(value)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises ConfigError instead of exiting, and prints help to a chosen file."""

    def __init__(self, *args, help_file=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._help_file = help_file

    def error(self, message):
        raise ConfigError(message)

    def print_help(self, file=None):
        super().print_help(file if file is not None else self._help_file)


_EPILOG = f"""\
batch size: --batch-size is the global batch; each rank takes batch_size / world_size rows
  per step, so it must be a multiple of the world size (an error names the nearest valid one).
resume: --checkpoint run.h5 --resume continues where run.h5 stopped (epoch, batch, optimizer
  and every random state) with the settings saved in it; with the same world size and backend
  the final parameters are bit-identical to a run that never stopped. The backend and the
  world size may change (the header says what changed and that bit-identity is given up).
threads: --threads auto gives each rank (CPUs it may use) / (ranks on this node) BLAS threads.
data: inputs that look unscaled (integers, values beyond +-10) get a warning; --normalize
  standard rescales them on load.
exit codes: 0 done; 1 an unhandled exception on any rank (the whole job is aborted); 2 bad
  input found before training (one 'error: ...' line from rank 0, nothing overwritten);
  3 a non-finite loss, gradient or parameter stopped training (the last checkpoint is kept);
  4 a checkpoint or metrics file could not be written (disk full; the previous file is kept);
  130 interrupted (Ctrl-C: one 'interrupted' line).
failures: an exception, a sys.exit(N), a Ctrl-C or a --timeout on any rank ends every rank; a
  killed rank ends the job through mpirun; the last checkpoint stays loadable. {variables.DEBUG.name}=1
  checks before every collective that all ranks make the same call.
examples:
  mpirun -n 2 python -m npddp.train
  mpirun -n 4 python -m npddp.train --backend ring --model cnn --epochs 5 --checkpoint run.h5
  mpirun -n 4 python -m npddp.train --checkpoint run.h5 --resume
  python -m npddp.evaluate run.h5
"""


#: The field that opens each section of --help.
_GROUPS = {"backend": "communication", "model": "model", "dataset": "data",
           "epochs": "optimisation", "checkpoint": "files", "threads": "process"}


def build_parser(help_file=None) -> argparse.ArgumentParser:
    """The parser for every Config field, with defaults and choices in the help."""
    parser = _Parser(prog=PROG, description="Train a NumPy model with Distributed Data Parallel over "
                     "MPI; rank 0 prints progress and writes the HDF5 files.", epilog=_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter, help_file=help_file,
                     allow_abbrev=False)
    hints = typing.get_type_hints(Config)
    group = parser
    for f in dataclasses.fields(Config):
        if f.name in _GROUPS:
            group = parser.add_argument_group(_GROUPS[f.name])
        meta = f.metadata
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        shown = meta["shown"] if meta["shown"] is not None else _show(default)
        text = _help(f) + f" (default: {shown})"
        if meta["resume"] == "match":
            text += " [fixed on resume]"
        elif meta["resume"] == "inherit":
            text += " [from the checkpoint]"
        kwargs: dict = {"dest": f.name, "default": argparse.SUPPRESS, "help": text}
        kind = hints[f.name]
        if kind is bool:
            kwargs["action"] = "store_true"
        else:
            if meta["parse"] is not None:
                kwargs["type"] = _checked(meta["parse"])
            elif kind is list:
                kwargs.update(type=int, nargs="+")
            else:
                kwargs["type"] = next(a for a in typing.get_args(kind) if a is not type(None)) \
                    if typing.get_origin(kind) is typing.Union else kind
            if f.name == "backend":
                kwargs["type"] = _checked(backend_name)     # its error names --plugin, which registers more
            if meta["choices"]:
                kwargs["choices"] = {"backend": backend_names, "comm_hook": comm_hook_names}.get(
                    f.name, lambda: meta["choices"])()
                kwargs["metavar"] = "{" + ",".join(meta["choices"]) + "}"
            elif meta["metavar"]:
                kwargs["metavar"] = meta["metavar"]
            if meta["const"] is not None:
                kwargs.update(nargs="?", const=meta["const"])
        group.add_argument(flag(f.name), **kwargs)
    return parser


def _checked(parse):
    """``parse`` as an argparse type: its ValueError becomes argparse's one-line error."""
    def convert(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def parse_args(argv=None, help_file=None) -> dict:
    """The flags given in ``argv`` (default ``sys.argv[1:]``) as {field: value}; ConfigError when bad.

    ``--help`` prints to ``help_file`` (stdout when None) and raises SystemExit(0). ``--plugin``
    modules are imported first, so ``--backend`` accepts the algorithms they register.
    """
    import sys
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--compression" or a.startswith("--compression=") for a in argv):
        raise ConfigError("--compression is gone; use --comm-hook {" + ",".join(comm_hook_names()) + "} "
                          "(none is allreduce; with --topk-ratio, --powersgd-rank, --powersgd-start-iter)")
    load_plugins(",".join(plugins.named(argv)))
    parser = build_parser(help_file)
    return vars(parser.parse_args(argv))


def load_plugins(text: str) -> None:
    """Import the comma-separated modules of ``text``; ConfigError naming one that cannot be imported."""
    try:
        plugins.load(plugins.split(text))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def parse_config(argv=None, help_file=None) -> Config:
    """A Config from ``argv``: the flags given, defaults for the rest; ConfigError on a bad or unknown flag."""
    return Config(**parse_args(argv, help_file))
