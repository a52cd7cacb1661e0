"""The flags ``./mpi_run.sh`` gives the launcher it found, from the table of MPI libraries.

    python -m npddp.process.launchflags --mpirun /path/to/mpirun -n 2 [--hostfile F] [--export VAR ...]

prints the program to run (the launcher, or the one its library's row says to run in its place) and
then the arguments before the command, one a line (see :mod:`npddp.util.mpilibs`); ``--library``
prints only the name of the library the launcher belongs to.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from npddp.util.mpilibs import MPILibrary, identify, launch_flags, program


def version_output(launcher: str, timeout: float = 20.0) -> str:
    """What ``launcher --version`` prints (stdout and stderr), or "" when it cannot run."""
    try:
        done = subprocess.run([launcher, "--version"], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


def library_of(launcher: str) -> MPILibrary:
    """The MPI library ``launcher`` starts jobs for."""
    return identify(launcher, version_output(launcher))


def main(argv=None) -> int:
    """Print the program and the launcher's flags, one a line (or ``--library``: its library's name)."""
    parser = argparse.ArgumentParser(prog="python -m npddp.process.launchflags", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mpirun", required=True, metavar="PATH", help="the launcher (mpirun, mpiexec, prterun)")
    parser.add_argument("-n", type=int, default=2, metavar="N", help="ranks (default 2)")
    parser.add_argument("--hostfile", default=None, metavar="FILE", help="hosts to place ranks on")
    parser.add_argument("--export", nargs="*", default=[], metavar="VAR", help="variables to pass to every rank")
    parser.add_argument("--library", action="store_true", help="print only the library's name")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"-n must be a positive integer, got {args.n}")
    lib = library_of(args.mpirun)
    if args.library:
        print(lib.name)
        return 0
    print("\n".join([program(lib, args.mpirun),
                     *launch_flags(lib, args.n, args.hostfile, args.export, root=os.geteuid() == 0)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
