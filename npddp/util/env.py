"""The process environment in one place: which launcher started us, rank and size, node, BLAS threads.

Every layer that needs to know how the job was launched reads it here, so each list of
launcher variables exists once. Nothing here imports MPI: the facts come from the environment
variables the launchers set (MPICH/Hydra, Open MPI, PMIx, Slurm's srun, and the torchrun-style
``python -m npddp.run``), and a process started by none of them is rank 0 of a world of one.

Launcher kinds (:func:`launcher`), first match wins: ``mpi`` (an MPI launcher's variables: mpirun,
mpiexec, or srun with an MPI plugin such as ``--mpi=pmi2``/``--mpi=pmix`` while mpi4py is installed),
``tcp`` (``RANK`` and ``WORLD_SIZE``: ``python -m npddp.run`` or torchrun), ``slurm`` (one task of an
srun step, :func:`slurm_task`: the TCP world is formed from Slurm's variables), else None.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass

from npddp.util import mpilibs, variables
from npddp.util.hostlist import expand_hostlist

#: Thread-count variables BLAS and OpenMP libraries read, in the order npddp reads them (OpenBLAS first,
#: as OpenBLAS itself does).
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: Variables MPI launchers set holding the world size (MPICH/Hydra, Open MPI, PMIx; srun with an MPI plugin
#: sets PMI or PMIx variables for the ranks it starts: PMIx gives a rank but no size, Slurm's variables do).
MPI_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")
#: Variables MPI launchers set holding this process's rank.
MPI_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
#: Any of these says an MPI launcher started this process.
MPI_LAUNCHER_VARIABLES = (*MPI_SIZE_VARIABLES, *MPI_RANK_VARIABLES, "MPI_LOCALNRANKS")
#: Variables a torchrun-style launcher (``python -m npddp.run``) sets; both must be present.
TCP_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE")
#: Variables holding the number of ranks on this node, in the order they are read.
LOCAL_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
#: Where POSIX shared memory lives: npddp's segments and MPI libraries' alike.
SHM_DIR = "/dev/shm"
#: Names of the segments MPI libraries create in /dev/shm (MPICH, Open MPI, Intel MPI, UCX, libfabric, PSM2),
#: from the table of libraries (npddp/util/mpilibs.py).
MPI_SHM_PATTERNS = mpilibs.SHM_PATTERNS


def _environ(environ):
    return os.environ if environ is None else environ


def first_int(names, environ=None, default: int = 0) -> int:
    """The first of ``names`` set to an integer, else ``default``."""
    environ = _environ(environ)
    for name in names:
        try:
            return int(environ[name])
        except (KeyError, ValueError):
            continue
    return default


def launched_by_mpi(environ=None) -> bool:
    """True when an MPI launcher (mpirun, mpiexec, srun with PMI) started this process."""
    environ = _environ(environ)
    return any(name in environ for name in MPI_LAUNCHER_VARIABLES)


def launched_by_tcp_launcher(environ=None) -> bool:
    """True when the launcher's world is over TCP: ``RANK``/``WORLD_SIZE`` (npddp.run, torchrun) or srun without MPI."""
    return launcher(environ) in ("tcp", "slurm")


def launcher(environ=None) -> str | None:
    """``mpi``, ``tcp`` (``python -m npddp.run`` or torchrun), ``slurm`` (srun, TCP world), or None: no launcher."""
    environ = _environ(environ)
    task = slurm_task(environ)
    if launched_by_mpi(environ) and (task is None or mpi4py_installed()):
        return "mpi"
    if all(name in environ for name in TCP_LAUNCHER_VARIABLES):
        return "tcp"
    return "slurm" if task is not None else None


def mpi4py_installed() -> bool:
    """True when mpi4py can be imported (found on the path; neither it nor MPI is loaded here)."""
    return importlib.util.find_spec("mpi4py") is not None


def mpi_world_size(environ=None) -> int:
    """The world size an MPI launcher announced (1 when there is none; srun's under its PMIx plugin)."""
    announced = first_int(MPI_SIZE_VARIABLES, environ, 0)
    task = slurm_task(environ) if launched_by_mpi(environ) else None
    return max(1, announced or (task.size if task is not None else 1))


def world_size(environ=None) -> int:
    """The world size any launcher announced (1 when there is none)."""
    task = slurm_task(environ)
    return max(1, first_int((*MPI_SIZE_VARIABLES, "WORLD_SIZE"), environ, task.size if task is not None else 1))


def world_rank(environ=None) -> int:
    """This process's rank as the launcher announced it (0 when there is none); MPI is not touched."""
    task = slurm_task(environ)
    return max(0, first_int((*MPI_RANK_VARIABLES, "RANK"), environ, task.rank if task is not None else 0))


def announced_world(environ=None) -> tuple[int, str] | None:
    """(world size, the variable that says so) as the launcher that started this process announced it; None: none did.

    Only the innermost launcher counts: an MPI launcher's (``PMI_SIZE``, ``OMPI_COMM_WORLD_SIZE``, ``PMIX_SIZE``),
    else ``python -m npddp.run``'s or torchrun's ``WORLD_SIZE``, else srun's. An outer launcher's size differs by
    design (srun starting mpirun's daemons, npddp.run inside an allocation). Under srun's PMIx plugin (a rank
    but no size) and srun without a plugin it is Slurm's ``SLURM_STEP_NUM_TASKS``.
    """
    environ = _environ(environ)
    if launched_by_mpi(environ):
        found = first_positive(MPI_SIZE_VARIABLES, environ)
        task = slurm_task(environ)
        return found if found is not None or task is None else (task.size, "SLURM_STEP_NUM_TASKS")
    if all(name in environ for name in TCP_LAUNCHER_VARIABLES):
        return first_positive(("WORLD_SIZE",), environ)
    task = slurm_task(environ)
    return None if task is None else (task.size, "SLURM_STEP_NUM_TASKS")


#: What to do when a world differs from the launcher's, by the variable that announced the launcher's size.
_WORLD_HINTS = {
    "WORLD_SIZE": "its ranks are separate processes, not one MPI job: run over tcp (--transport auto or tcp, a "
                  "hand-written backend), or start the job with mpirun",
    "SLURM_STEP_NUM_TASKS": "srun gave MPI no process manager: add --mpi=pmi2 (MPICH, Intel MPI) or --mpi=pmix "
                            "(Open MPI), or run over tcp (--transport auto or tcp); see docs/guide/slurm.md",
}
_MPI_HINT = ("this MPI does not speak the launcher's process manager (under srun: --mpi=pmix for Open MPI, "
             "--mpi=pmi2 for MPICH and Intel MPI; see docs/guide/slurm.md)")


def world_refusal(size: int, built_by: str = "MPI", environ=None) -> str | None:
    """The one line when a world of ``size`` ranks (built by ``built_by``: MPI, or the tcp rendezvous) is not the world
    the launcher announced, or when Slurm's variables contradict each other; None when all agree.

    A library that cannot talk to the launcher's process manager starts every process as a world of its own
    (Open MPI under ``srun --mpi=pmi2``, ``--transport mpi`` under srun without a plugin or under npddp.run):
    N separate one-rank jobs, each "succeeding". Every world npddp builds is checked here, the one place.
    """
    bad = slurm_contradiction(environ)
    if bad is not None:
        return bad
    announced = announced_world(environ)
    if announced is None or announced[0] == size:
        return None
    count, variable = announced
    return (f"{built_by} started a world of {size} rank{'s' * (size != 1)} but the launcher announced {count} "
            f"({variable}={count}): {_WORLD_HINTS.get(variable, _MPI_HINT)}")


def slurm_contradiction(environ=None) -> str | None:
    """One line when srun's variables make this process a task of a step but its rank does not fit the step's
    tasks (``SLURM_PROCID=2`` of 2, ``-1``, not a number); None otherwise, and when another launcher inside the
    job started it (mpirun's ranks, npddp.run's: their own variables rule)."""
    environ = _environ(environ)
    if launched_by_mpi(environ) or all(name in environ for name in TCP_LAUNCHER_VARIABLES):
        return None
    rank = _first(environ, "SLURM_PROCID")
    size = _first(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    ids = [_first(environ, *names) for names in (("SLURM_JOB_ID", "SLURM_JOBID"), ("SLURM_STEP_ID", "SLURM_STEPID"))]
    if rank is None or size is None or None in ids:
        return None          # not a task of a step: a batch script, a shell in an allocation
    if rank.isdigit() and size.isdigit() and 0 <= int(rank) < int(size):
        return None
    name = "SLURM_STEP_NUM_TASKS" if _first(environ, "SLURM_STEP_NUM_TASKS") is not None else "SLURM_NTASKS"
    valid = f"0..{int(size) - 1}" if size.isdigit() and int(size) > 0 else "0..tasks-1, with tasks >= 1"
    return (f"Slurm's variables contradict each other: SLURM_PROCID={rank} with {name}={size} (valid: {valid}), "
            "so this task's place in its step is unknown; start it with srun, or unset the SLURM_ variables")


def job_identity(environ=None) -> str:
    """What names this process's job to the tcp rendezvous: the same on every rank of one job, another job's differs.

    Slurm's job and step (``slurm job 7 step 0``) for a TCP world formed from srun's variables; the job id
    ``python -m npddp.run`` gives its ranks when they are all on this machine (each machine's launcher makes
    its own); torchrun's run id; else "" (nothing to compare).
    """
    environ = _environ(environ)
    task = slurm_task(environ)
    if task is not None:
        return f"slurm job {task.job_id} step {task.step_id}"
    if not all(name in environ for name in TCP_LAUNCHER_VARIABLES):
        return ""
    job = environ.get(variables.JOB_ID.name, "").strip()
    if job and environ.get("LOCAL_WORLD_SIZE", "").strip() == environ["WORLD_SIZE"].strip():
        return f"npddp.run job {job}"
    run = environ.get("TORCHELASTIC_RUN_ID", "").strip()
    return f"torchrun run {run}" if run else ""


#: Variables that say which process manager a launcher runs: PMI-1/PMI-2 (MPICH's hydra, Intel MPI's, srun
#: --mpi=pmi2) or PMIx (Open MPI's mpirun, which is PRRTE, and srun --mpi=pmix).
PROCESS_MANAGER_VARIABLES = {"pmi": ("PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT"),
                             "pmix": ("PMIX_RANK", "PMIX_NAMESPACE", "OMPI_COMM_WORLD_SIZE")}


def process_manager(environ=None) -> str | None:
    """``pmi`` or ``pmix``: the one process manager the launcher's variables speak of; None for none or both."""
    environ = _environ(environ)
    found = [kind for kind, names in PROCESS_MANAGER_VARIABLES.items() if any(n in environ for n in names)]
    return found[0] if len(found) == 1 else None


def first_positive(names, environ=None) -> tuple[int, str] | None:
    """(value, variable) of the first of ``names`` set to a positive integer, else None."""
    environ = _environ(environ)
    for name in names:
        raw = environ.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw), name
    return None


def local_size(environ=None) -> tuple[int, str] | None:
    """(ranks on this node, the variable that said so), or None when no launcher said."""
    announced = first_positive(LOCAL_SIZE_VARIABLES, environ)
    task = slurm_task(environ) if announced is None else None
    return announced if task is None else (task.local_size, "SLURM_STEP_TASKS_PER_NODE")


def thread_setting(environ=None) -> tuple[int, str] | None:
    """(threads, variable) for the first thread variable set to a positive integer, else None."""
    return first_positive(THREAD_VARIABLES, environ)


def slurm_cpus_per_task(environ=None) -> int | None:
    """The CPUs Slurm gave each task (``SLURM_CPUS_PER_TASK``, set by ``-c``/``--cpus-per-task``), else None."""
    found = first_positive(("SLURM_CPUS_PER_TASK",), environ)
    return None if found is None else found[0]


#: The argument check's switch (:mod:`npddp.comm.signature`), declared in :mod:`npddp.util.variables`.
CHECK_ARGS_VARIABLE = variables.CHECK_ARGS.name
#: The launcher's join directory (``python -m npddp.run``): each rank marks there when it starts to join the
#: TCP world and when it has joined, so a rank that leaves before joining is noticed at once.
JOIN_DIR_VARIABLE = variables.JOIN_DIR.name


def mpi_live():
    """The ``mpi4py.MPI`` module when this process has loaded it and MPI is initialized, not finalized; else None.

    Never imports mpi4py and never initializes MPI; a broken MPI counts as not live.
    """
    mpi = sys.modules.get("mpi4py.MPI")
    try:
        return mpi if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() else None
    except Exception:  # noqa: BLE001  (an MPI that cannot answer: nothing to use)
        return None


def mark_join(stage: str, rank: int, environ=None) -> None:
    """Mark ``stage`` ("joining" or "joined") for ``rank`` in the launcher's join directory, if there is one."""
    directory = variables.text(variables.JOIN_DIR, environ)
    if directory:
        try:
            with open(os.path.join(directory, f"{stage}-{rank}"), "w"):
                pass
        except OSError:
            pass  # the launcher has gone or cleaned up: nothing to tell it


#: The ports a TCP world under srun listens on for its rendezvous when ``MASTER_PORT`` is not given:
#: ``SLURM_PORT_BASE + (job id * SLURM_STEP_SLOTS + step id) % SLURM_PORT_SPAN``, below Linux's ephemeral range.
SLURM_PORT_BASE = 12000
SLURM_PORT_SPAN = 20000
SLURM_STEP_SLOTS = 16


@dataclass(frozen=True)
class SlurmTask:
    """This process as one task of an srun step: what Slurm's variables say about it."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    nodelist: str      # the step's nodes, in Slurm's compressed form (``node[01-04,07]``)
    nodes: int
    job_id: int
    step_id: int

    @property
    def master_addr(self) -> str:
        """Where rank 0 listens: loopback when the step has one node, else the first node of the step."""
        hosts = [] if self.nodes == 1 else expand_hostlist(self.nodelist)
        return "127.0.0.1" if self.nodes == 1 or len(hosts) == 1 else hosts[0]

    @property
    def master_port(self) -> int:
        """The rendezvous port every task of this step derives alike from the job and step ids."""
        return SLURM_PORT_BASE + (self.job_id * SLURM_STEP_SLOTS + self.step_id) % SLURM_PORT_SPAN


def _first(environ, *names: str) -> str | None:
    return next((environ[n].strip() for n in names if environ.get(n, "").strip()), None)


def slurm_task(environ=None) -> SlurmTask | None:
    """This process as a task of an srun step, or None: not started by srun (a batch script itself, an
    allocation's shell), or started by a launcher inside the job (``python -m npddp.run``; mpirun, whose ranks
    announce another rank or size than Slurm's)."""
    environ = _environ(environ)
    if all(name in environ for name in TCP_LAUNCHER_VARIABLES):
        return None
    raw = [_first(environ, *names) for names in (("SLURM_PROCID",), ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
                                                 ("SLURM_JOB_ID", "SLURM_JOBID"), ("SLURM_STEP_ID", "SLURM_STEPID"))]
    nodelist = _first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    if nodelist is None or not all(v is not None and v.isdigit() for v in raw):
        return None
    rank, size, job_id, step_id = map(int, raw)
    if not 0 <= rank < size:
        return None
    if first_int(MPI_RANK_VARIABLES, environ, rank) != rank or first_int(MPI_SIZE_VARIABLES, environ, size) != size:
        return None
    local_rank = first_int(("SLURM_LOCALID",), environ, rank)
    local_size = _tasks_on_this_node(environ)
    local_size = local_size if local_size is not None and local_size > local_rank else local_rank + 1
    nodes = first_int(("SLURM_STEP_NUM_NODES", "SLURM_NNODES"), environ, 0)   # 0: unknown, the list decides
    return SlurmTask(rank, size, local_rank, local_size, nodelist, nodes, job_id, step_id)


def _tasks_on_this_node(environ) -> int | None:
    """Tasks of the step on this node, from ``SLURM_STEP_TASKS_PER_NODE`` (``2(x3),1``) and ``SLURM_NODEID``."""
    text = _first(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    counts = []
    for part in (text or "").split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return None
        counts += [int(match[1])] * int(match[2] or 1)
    node = first_int(("SLURM_NODEID",), environ, 0)
    return counts[node] if 0 <= node < len(counts) else None
