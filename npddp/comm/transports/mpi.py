"""The MPI transport: the hand-written algorithms' messages through mpi4py's ``Isend``/``Irecv``.

Messages are bytes (``MPI_BYTE``): what a receive got is counted in bytes and checked above, where
the receiving buffer's dtype is known. Only point-to-point methods of the wrapped communicator are
called (``Isend``, ``Irecv``, and ``Test``/``Cancel``/``Free`` on their requests), never a
collective, so an algorithm over this transport is a hand-written schedule, not MPI's. The one
exception is :meth:`MPITransport.split` (``MPI_Comm_split``), which ``hier`` calls once, at setup,
to make its group of ranks across nodes.
"""

from __future__ import annotations

import os
import re
import sys
import weakref

import numpy as np

from npddp.util import env, guard, mpilibs


def free_comm(comm, abandoned: list) -> None:
    """Free a communicator this package duplicated, unless MPI is finalized, a request on it was abandoned, or a
    message sent on it arrived and was never received.

    Once a context is freed MPI may give it to the next communicator made (MPICH does), which would then
    match such a message: one sent for an abandoned request, or one a peer sent to a rank whose program
    ended first (a mismatch's abort, a send never received). So those communicators are kept.
    """
    from mpi4py import MPI
    if abandoned[0] or not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL or MPI.Is_finalized():
        return
    if not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG):
        comm.Free()


def check_world_size(size: int, environ=None) -> None:
    """ValueError when MPI's world of ``size`` ranks is not the world the launcher announced
    (:func:`npddp.util.env.world_refusal`: the one rule for every world)."""
    refusal = env.world_refusal(size, "MPI", environ)
    if refusal is not None:
        raise ValueError(refusal)


def mpi_world():
    """``MPI.COMM_WORLD``, checked against the world size the launcher announced (:func:`check_world_size`).

    In a world of one, the shared-memory files the library made for on-node peers are unlinked at once (their
    mappings stay valid): no peer will ever open them, and Open MPI leaves them in /dev/shm when its process
    manager is missing (16 MiB each, a singleton's or a wrong launcher's), since that manager would remove them.
    """
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_size() == 1:
        guard.remove_mapped_segments()
    check_world_size(MPI.COMM_WORLD.Get_size())
    return MPI.COMM_WORLD


def mpi_missing(environ=None) -> str | None:
    """Why MPI cannot carry a process no launcher started (mpi4py missing, or its library), else None.

    Loading MPI initializes it, as every MPI run does; only asked where no launcher's variables are set
    (``environ`` None: this process's own), so a world of one goes over tcp instead.
    """
    if environ is not None or env.launcher() is not None:
        return None
    if not env.mpi4py_installed():
        return "mpi4py is not installed"
    try:
        from mpi4py import MPI  # noqa: F401
    except (ImportError, RuntimeError):
        return "mpi4py's MPI library does not load"
    return None


def launcher_refusal(environ=None) -> str | None:
    """The one line when the MPI library mpi4py would load cannot speak the launcher's process manager, found
    before ``MPI_Init`` (which would end the process in the library's own words); None when it can or is loaded.

    MPICH (not Intel MPI) speaks PMI only unless built with PMIx: under Open MPI's mpirun or ``srun
    --mpi=pmix`` (PMIx variables, no PMI ones) its ``MPI_Init`` aborts. The opposite mismatch, Open MPI under
    PMI, starts worlds of one and is found by :func:`check_world_size`.
    """
    if "mpi4py.MPI" in sys.modules or env.process_manager(environ) != "pmix":
        return None
    found = _library_before_init()
    if found is None:
        return None
    lib, text, path = found
    if "pmix" in lib.process_managers or not re.search(lib.version_text, text, re.IGNORECASE) or _links_pmix(path):
        return None   # speaks PMIx, or a library the table cannot name: let MPI_Init decide
    version = " ".join(text.split()[:3])
    return (f"the MPI library mpi4py loads ({version}, {path}) does not speak PMIx, the process manager of this "
            f"launcher (PMIX_* variables: Open MPI's mpirun, or srun --mpi=pmix): start it with {lib.name}'s own "
            "mpirun, or under srun with --mpi=pmi2; see docs/guide/slurm.md")


def _library_before_init():
    """(row of :mod:`npddp.util.mpilibs`, ``MPI_Get_library_version``'s text, path) of the library mpi4py
    would load, asked through ctypes before ``MPI_Init`` (allowed by the standard); None when it cannot be told."""
    import ctypes
    try:
        from mpi4py import _mpiabi
        lib = _mpiabi._dlopen_libmpi()
        buf, length = ctypes.create_string_buffer(8192), ctypes.c_int(0)
        if lib.MPI_Get_library_version(buf, ctypes.byref(length)) != 0:
            return None
    except Exception:  # noqa: BLE001  (no mpi4py, no library, another mpi4py: nothing to tell before MPI_Init)
        return None
    text = buf.value.decode(errors="replace")
    return mpilibs.identify("", text), text, lib._name or "libmpi"


def _links_pmix(path: str) -> bool:
    """True when the library at ``path`` reaches PMIx's client (``PMIx_Init``), as a PMIx-enabled build does."""
    import ctypes
    try:
        return hasattr(ctypes.CDLL(path, os.RTLD_LAZY | os.RTLD_LOCAL), "PMIx_Init")
    except OSError:
        return False


class MPIRequest:
    """A transport request over an mpi4py request; a receive's keeps its MPI status (the bytes that came)."""

    __slots__ = ("_request", "_done", "_is_recv", "_abandoned", "_status", "_room")

    def __init__(self, request, is_recv: bool, abandoned: list, status=None, room: int = 0):
        self._request = request
        self._done = False
        self._is_recv = is_recv
        self._abandoned = abandoned
        self._status, self._room = status, room   # a receive's MPI.Status and its buffer's bytes

    def test(self) -> bool:
        """MPI_Test; a receive whose message is longer than its buffer raises ValueError, as over TCP."""
        if not self._done:
            if self._status is None:
                self._done = self._request.Test()
            else:
                try:
                    self._done = self._request.Test(self._status)
                except Exception as exc:   # mpi4py is looked up here only, not at every poll
                    from mpi4py import MPI
                    if not isinstance(exc, MPI.Exception) or exc.Get_error_class() != MPI.ERR_TRUNCATE:
                        raise
                    self._done = True
                    status = self._status
                    raise ValueError(f"message from rank {status.Get_source()} with tag {status.Get_tag()} is longer "
                                     f"than the {self._room} bytes of the receive buffer (MPI: message truncated)"
                                     ) from None
        return self._done

    def received(self) -> tuple[int, None]:
        """A completed receive's payload bytes, and None: MPI's messages do not carry the sender's dtype."""
        return self._status.Get_count(), None

    def cancel(self) -> None:
        """Cancel (receives only: cancelling sends is not portable) and free; MPI may still touch the buffer.

        A request that has failed (a receive whose message did not fit) is complete: nothing to cancel;
        once MPI has ended (a communicator collected at exit), nothing can be."""
        if self._done:
            return
        self._done = True
        self._abandoned[0] = True
        if env.mpi_live() is None:
            return
        request = self._request
        try:
            done = request.Test()
        except Exception:   # mpi4py's MPI.Exception: the request completed with an error
            return
        if not done and self._is_recv:
            request.Cancel()
            try:
                done = request.Test()   # a receive's cancel is local: this completes (and frees) it at once
            except Exception:
                return
        if not done:
            request.Free()


class MPITransport:
    """Point-to-point messages over an mpi4py communicator (``MPI.COMM_WORLD`` when None)."""

    name = "mpi"

    def __init__(self, mpi_comm=None, dup: bool = False, owned: bool = False):
        """``dup``: run over a duplicate of ``mpi_comm`` (collective); ``owned``: ``mpi_comm`` was made for this
        transport. Either way the communicator is freed when the transport is collected (:func:`free_comm`)."""
        if mpi_comm is None:
            mpi_comm = mpi_world()
        self._abandoned = [False]
        if dup:  # a context of its own (collective): no other communicator ever matches its messages
            mpi_comm = mpi_comm.Dup()
        if dup or owned:
            weakref.finalize(self, free_comm, mpi_comm, self._abandoned)
        self.comm = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        from mpi4py import MPI
        #: The largest tag the library takes (``MPI_TAG_UB``: at least 32767; 2**29 - 1 or more in MPICH, Open MPI
        #: and Intel MPI), which bounds the shape indices the argument check folds into tags.
        self.tag_bound = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        #: This process's place in the job (errors name a group's rank with it: npddp.comm.engine.call.rank_label).
        self.world_rank, self.world_size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        self._status, self._any_tag, self._new_status, self._byte = MPI.Status(), MPI.ANY_TAG, MPI.Status, MPI.BYTE

    def isend(self, buf: np.ndarray, dest: int, tag: int) -> MPIRequest:
        """MPI_Isend of ``buf``'s bytes."""
        return MPIRequest(self.comm.Isend([buf, self._byte], dest, tag), False, self._abandoned)

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> MPIRequest:
        """MPI_Irecv into ``buf``'s bytes (a typed receive of a part of an element would abort MPICH)."""
        return MPIRequest(self.comm.Irecv([buf, self._byte], source, tag), True, self._abandoned, self._new_status(),
                          buf.nbytes)

    def unmatched_tags(self, source: int) -> tuple:
        """The tag of the first message from ``source`` that has arrived and no receive has taken (MPI_Iprobe)."""
        status = self._status
        return (status.Get_tag(),) if self.comm.Iprobe(source, self._any_tag, status) else ()

    def split(self, colors) -> "MPITransport":
        """The transport among the ranks whose color matches this rank's (collective: every rank, same list)."""
        return MPITransport(self.comm.Split(int(colors[self.rank]), self.rank), owned=True)
