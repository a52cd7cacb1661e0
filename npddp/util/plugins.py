"""Plugin modules (``--plugin MODULE``): finding them on a command line and importing them.

A plugin is a module a user names by dotted name or ``.py`` path; importing it registers
all-reduce algorithms (``npddp.comm.register_algorithm``). Entry points load the plugins before
their parser runs, so the parser's list of backends already holds what the plugins register.
"""

from __future__ import annotations

import importlib
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path

#: The command-line flag that names a plugin module.
FLAG = "--plugin"


def named(argv) -> list[str]:
    """The values of every ``--plugin VALUE`` and ``--plugin=VALUE`` in ``argv``, in order (no parser needed)."""
    argv = list(argv)
    values = []
    for i, arg in enumerate(argv):
        if arg == FLAG and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif arg.startswith(FLAG + "="):
            values.append(arg.split("=", 1)[1])
    return values


def split(text: str) -> list[str]:
    """The modules of a comma-separated list, blanks and empty items dropped."""
    return [m.strip() for m in text.split(",") if m.strip()]


def load(modules) -> None:
    """Import each of ``modules`` (dotted names or ``.py`` paths; they register algorithms); ValueError naming a bad one."""
    for module in modules or ():
        try:
            if module.endswith(".py"):
                spec = spec_from_file_location(f"npddp_plugin_{Path(module).stem}", module)
                if spec is None or not Path(module).is_file():
                    raise ImportError(f"no such file {module}")
                spec.loader.exec_module(module_from_spec(spec))
            else:
                importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"{FLAG} {module!r} cannot be imported: {exc}") from None
        except Exception as exc:       # the module's own code failed while it was imported
            raise ValueError(f"{FLAG} {module!r} raised {type(exc).__name__} while imported: {exc}") from None
