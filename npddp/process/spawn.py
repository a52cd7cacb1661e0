"""Start N ranks of a Python program on this machine with no MPI at all, in the manner of torchrun.

    python -m npddp.run --nproc 4 -m npddp.train --backend ring          # 4 ranks over TCP
    python -m npddp.run --nproc 2 --prefix my_script.py --lr 0.1          # a script; lines tagged [rank]
    # two hosts, 4 ranks each (run one command per host; same address and port on both):
    python -m npddp.run --nnodes 2 --node-rank 0 --nproc 4 --master-addr 10.0.0.1 --master-port 29500 -m npddp.train --backend auto
    python -m npddp.run --nnodes 2 --node-rank 1 --nproc 4 --master-addr 10.0.0.1 --master-port 29500 -m npddp.train --backend auto

Each process gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` (a free port by default), from which
``npddp.comm.create(..., transport="auto")`` builds the TCP mesh, and one BLAS thread unless
the environment or ``--threads`` says otherwise. Their output reaches the launcher's a whole
line at a time (:mod:`npddp.process.output`). When any process fails or is killed, the
others get half a second to exit on their own (a failure every rank agreed on, such as bad
flags) and are then stopped (SIGTERM, then SIGKILL after ``--grace`` seconds) and the launcher exits
with the failing rank's code (128 + signal; a specific status beats the 1 its peers exit with); Ctrl-C is forwarded to every process.
Processes die with the launcher (``PR_SET_PDEATHSIG``), so none outlives it. Shared-memory
segments the job left behind are removed when it ends abnormally.

Every job gets a fresh secret in ``NPDDP_JOB_SECRET`` (or ``--secret-file``'s, shared by every
machine of a multi-node job) that every TCP connection of the job must prove it holds
(docs/design/security.md). ``--max-restarts K`` starts the whole job again after a failure, at most
K times, with ``NPDDP_RESTART_COUNT`` set (``npddp.train --resume auto`` then continues from
its checkpoint); exit status 2 (bad flags or files) is final.
"""

from __future__ import annotations

import argparse
import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

from npddp.comm.node.names import remove_job_segments
from npddp.comm.transports.handshake import new_secret
from npddp.comm.transports.rendezvous import is_loopback, listen_refusal
from npddp.process import joindir, output
from npddp.process.job import EXIT_USAGE
from npddp.util import variables
from npddp.util.env import JOIN_DIR_VARIABLE, THREAD_VARIABLES

PROG = "python -m npddp.run"
#: The job's secret every TCP connection proves it holds.
SECRET_VARIABLE = variables.JOB_SECRET.name
#: The environment variable telling a rank how many times the job was restarted (0: the first start).
RESTART_VARIABLE = variables.RESTART_COUNT.name


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                usage=f"{PROG} [options] (-m MODULE | SCRIPT) [program arguments ...]",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Everything after the module name or script path goes to the program unchanged.")
    p.add_argument("--nproc", "--nproc-per-node", type=int, default=1, metavar="N",
                   help="processes to start on this machine (default: 1)")
    p.add_argument("--nnodes", type=int, default=1, metavar="N", help="machines in the job (default: 1)")
    p.add_argument("--node-rank", type=int, default=0, metavar="R",
                   help="this machine's index, 0..nnodes-1; its ranks are R*nproc .. R*nproc+nproc-1 (default: 0)")
    p.add_argument("--master-addr", default="127.0.0.1", metavar="HOST",
                   help="address of the machine running rank 0, reachable from every machine (default: 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=0, metavar="PORT",
                   help="port rank 0 listens on for the rendezvous (default: a free port; required with --nnodes > 1)")
    p.add_argument("--threads", default=None, metavar="N",
                   help="BLAS/OpenMP threads per process (default: 1, unless OMP_NUM_THREADS etc. are set)")
    p.add_argument("--prefix", action="store_true", help="prefix every output line with the rank that printed it")
    p.add_argument("--grace", type=float, default=5.0, metavar="SECONDS",
                   help="after a failure, seconds between SIGTERM and SIGKILL for the others (default: 5)")
    p.add_argument("--secret-file", default=None, metavar="PATH",
                   help="file holding the job secret every connection must prove (readable by you only); the "
                        f"same file on every machine of a multi-node job (default: {SECRET_VARIABLE}, else a fresh "
                        "secret per job; several machines need one of the two)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                   help="when a rank fails, stop every rank and start the job again, at most K times; each "
                        f"start sees {RESTART_VARIABLE} (default: 0, a failure is final)")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m MODULE")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The launcher's options; ``module`` (or None) and ``program`` (script and arguments, or module arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _parser()
    valued = {s for a in p._actions if a.nargs != 0 for s in a.option_strings}
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "--"):
        i += 2 if argv[i] in valued else 1
    if i < len(argv) and argv[i] == "-m":
        i += 2  # the module name is the launcher's; what follows is the program's
    elif i < len(argv) and argv[i] == "--":
        argv.pop(i)
    args = p.parse_args(argv[:i])
    args.program = argv[i:]
    _check(p, args)
    return args


def _check(p: argparse.ArgumentParser, args) -> None:
    """Reject bad values with one ``error:`` line naming the valid range."""
    if args.nproc < 1:
        p.error(f"--nproc {args.nproc} is out of range; valid: 1 or more")
    if args.nnodes < 1:
        p.error(f"--nnodes {args.nnodes} is out of range; valid: 1 or more")
    if not 0 <= args.node_rank < args.nnodes:
        p.error(f"--node-rank {args.node_rank} is out of range; valid: 0..{args.nnodes - 1}")
    if not 0 <= args.master_port <= 65535:
        p.error(f"--master-port {args.master_port} is out of range; valid: 1..65535 (0: a free port)")
    if args.nnodes > 1 and not args.master_port:
        p.error("--master-port is required with --nnodes > 1 (the same on every machine)")
    if args.threads is not None and not (args.threads.isdigit() and int(args.threads) >= 1):
        p.error(f"--threads {args.threads!r} is out of range; valid: an integer >= 1")
    if not 0 < args.grace < 3600:
        p.error(f"--grace {args.grace} is out of range; valid: 0 < seconds < 3600")
    if not args.module and not args.program:
        p.error("no program given: pass a script path or -m MODULE")
    if not 0 <= args.max_restarts <= 1000:
        p.error(f"--max-restarts {args.max_restarts} is out of range; valid: 0..1000")
    try:
        socket.getaddrinfo(args.master_addr, None)
    except (OSError, UnicodeError) as exc:
        p.error(f"--master-addr {args.master_addr!r} does not resolve ({getattr(exc, 'strerror', None) or exc})")
    args.secret = _job_secret(p, args)


def _job_secret(p: argparse.ArgumentParser, args, environ=None) -> str:
    """The job's secret: from ``--secret-file`` (owner-only), else ``NPDDP_JOB_SECRET``, else a fresh one."""
    environ = os.environ if environ is None else environ
    if args.secret_file is not None:
        try:
            mode = os.stat(args.secret_file).st_mode
            with open(args.secret_file, encoding="utf-8") as f:
                secret = f.read().strip()
        except (OSError, UnicodeError) as exc:
            p.error(f"--secret-file {args.secret_file!r} cannot be read ({getattr(exc, 'strerror', None) or exc})")
        if mode & 0o077:
            p.error(f"--secret-file {args.secret_file!r} is readable or writable by others (mode "
                    f"{mode & 0o777:o}); valid: only you (chmod 600 {args.secret_file})")
        if len(secret) < 16:
            p.error(f"--secret-file {args.secret_file!r} holds {len(secret)} characters; valid: 16 or more "
                    f"(e.g. python -c 'import secrets; print(secrets.token_hex(32))' > FILE)")
        return secret
    secret = variables.text(variables.JOB_SECRET, environ)
    if secret:
        return secret
    if args.nnodes == 1:
        return new_secret()
    refusal = listen_refusal("", environ)
    if refusal:
        p.error(refusal)
    if not is_loopback(args.master_addr):
        p.error(f"--nnodes {args.nnodes} needs a secret shared by every machine: --secret-file PATH (the same "
                f"file everywhere, mode 600) or {SECRET_VARIABLE}")
    return ""   # several launchers on one machine without a shared secret: loopback only, unauthenticated


def free_port(host: str) -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rank_env(args, local_rank: int, port: int, job: str, environ=None) -> dict:
    """The environment of local process ``local_rank``."""
    env = dict(os.environ if environ is None else environ)
    env.update(RANK=str(args.node_rank * args.nproc + local_rank), WORLD_SIZE=str(args.nnodes * args.nproc),
               LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR=args.master_addr,
               MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
    env[variables.JOB_ID.name] = job
    secret = getattr(args, "secret", None)
    if secret:
        env[SECRET_VARIABLE] = secret
    for name in THREAD_VARIABLES:
        if args.threads is not None:
            env[name] = args.threads
        else:
            env.setdefault(name, "1")
    return env


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the launcher dies (Linux), so no rank is orphaned."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Job:
    """The local processes of one launch: start them, watch them, stop them all when one fails."""

    def __init__(self, args, command: list[str], restart: int = 0, outputs=None):
        self.args, self.command, self.restart = args, command, restart
        self.out, self.err = outputs or output.launcher_outputs()   # the launcher's stdout and stderr
        self.job = secrets.token_hex(6)
        self.procs: list[subprocess.Popen] = []
        self.pumps: list[threading.Thread] = []
        self.stopping = False
        self.join_dir = ""       # where the ranks mark joining and having joined the TCP world
        self.join: joindir.JoinDir | None = None

    def start(self) -> None:
        args = self.args
        port = args.master_port or free_port(args.master_addr)
        self.join = joindir.create(self.job)
        self.join_dir = self.join.path
        for local in range(args.nproc):  # every process first: preexec_fn is unsafe once threads run
            env = rank_env(args, local, port, self.job)
            env[RESTART_VARIABLE] = str(self.restart)
            env[JOIN_DIR_VARIABLE] = self.join_dir
            pipes = [os.pipe(), os.pipe()]   # the rank's stdout and stderr, forwarded whole lines at a time
            try:
                self.procs.append(subprocess.Popen(self.command, env=env, stdout=pipes[0][1], stderr=pipes[1][1],
                                                   start_new_session=True, preexec_fn=_die_with_parent))
            finally:
                for _, write_end in pipes:
                    os.close(write_end)
            tag = f"[{args.node_rank * args.nproc + local}] ".encode() if args.prefix else b""
            self.pumps += [output.start(read_end, out, tag) for (read_end, _), out in zip(pipes, (self.out, self.err))]

    def signal_all(self, sig: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal every live process, then SIGKILL what is left after the grace period."""
        self.stopping = True
        self.signal_all(sig)
        deadline = time.monotonic() + self.args.grace
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.05)
        self.signal_all(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
        self.remove_join_dir()

    def remove_join_dir(self) -> None:
        if self.join is not None:
            self.join.remove()

    def _marked(self, stage: str, local: int) -> bool:
        return os.path.exists(os.path.join(self.join_dir, f"{stage}-{self.args.node_rank * self.args.nproc + local}"))

    def _waiting_for(self, left: list[int]) -> list[int]:
        """Live local ranks stuck joining a world that ``left`` (exited without joining) can never complete."""
        if not left:
            return []
        return [j for j, p in enumerate(self.procs) if p.poll() is None and self._marked("joining", j)
                and not self._marked("joined", j)]

    def watch(self) -> int:
        """Wait for every process; after a failure let the rest exit or stop them. The job's exit code."""
        exits: queue.Queue = queue.Queue()     # (local index, exit code), in the order the processes ended
        for i, proc in enumerate(self.procs):
            threading.Thread(target=lambda i=i, proc=proc: exits.put((i, proc.wait())), daemon=True).start()
        failures, ended, settle, left = [], 0, None, []
        while ended < len(self.procs) and (settle is None or time.monotonic() < settle):
            waiting = [] if settle else self._waiting_for(left)
            if waiting:  # a rank exited 0 before joining: the others would wait for it until their timeout
                base = self.args.node_rank * self.args.nproc
                self.err.say(f"{PROG}: rank {base + left[0]} exited with code 0 before joining the job, while "
                             f"rank{'s' * (len(waiting) > 1)} {', '.join(str(base + j) for j in waiting)} "
                             f"wait{'s' * (len(waiting) == 1)} for it; stopping every rank\n")
                self.stop()
                remove_job_segments(self.job)
                return 1
            try:
                i, code = exits.get(timeout=0.01 if settle else 0.1)   # a timeout keeps Ctrl-C responsive
            except queue.Empty:
                continue
            ended += 1
            if not code and not self._marked("joined", i):
                left.append(i)
            if code:
                failures.append((i, code))
                settle = settle or time.monotonic() + _SETTLE_S  # a failure all ranks agreed on ends them all
        if failures:
            i, code = _cause(failures)
            rank = self.args.node_rank * self.args.nproc + i
            stopped = [self.args.node_rank * self.args.nproc + j for j, p in enumerate(self.procs)
                       if p.poll() is None and _is_stopped(p.pid)]
            if stopped:  # the others timed out waiting for it: it is the cause, not the one that gave up
                self.err.say(f"{PROG}: rank{'s' * (len(stopped) > 1)} {', '.join(map(str, stopped))} "
                             f"{'are' if len(stopped) > 1 else 'is'} stopped (e.g. SIGSTOP or a debugger), "
                             f"so rank {rank} {_describe(code)}; stopping every rank\n")
                self.stop()
            elif any(p.poll() is None for p in self.procs):
                self.err.say(f"{PROG}: rank {rank} {_describe(code)}; stopping the other ranks\n")
                self.stop()
            else:
                self.err.say(f"{PROG}: rank {rank} {_describe(code)}\n")
        for pump in self.pumps:
            pump.join(timeout=1.0)
        self.remove_join_dir()
        if not failures:
            return 0
        remove_job_segments(self.job)
        return 128 - code if code < 0 else code


def _cause(failures: list) -> tuple[int, int]:
    """The failure to report among ``(index, code)`` in exit order: the first signal or code other than 1.

    Peers of a rank that failed exit with 1 (an exception: the connection broke) and may do so
    before it has finished exiting; a specific status is the cause. Failing that, the first.
    """
    return next((f for f in failures if f[1] != 1), failures[0])


#: Exit statuses never restarted: a failure every rank agreed on (bad flags, files) repeats itself.
_FINAL = (EXIT_USAGE,)

#: Seconds the other ranks get to exit on their own after the first failure, before SIGTERM.
_SETTLE_S = 0.5


def _is_stopped(pid: int) -> bool:
    """True when process ``pid`` is stopped (state T or t in /proc; False where that cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _describe(code: int) -> str:
    """``exited with code 3`` or ``was killed by SIGKILL``."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def main(argv=None) -> int:
    """Launch, watch (restarting after a failure, up to ``--max-restarts`` times), and return the exit code."""
    args = parse_args(argv)
    command = [sys.executable, "-u"] + (["-m", args.module] if args.module else []) + args.program
    current: list[Job] = []
    outputs = output.launcher_outputs()
    err = outputs[1]

    def forward(signum, frame):  # Ctrl-C or a kill of the launcher: stop every rank the same way
        err.say(f"{PROG}: interrupted ({signal.Signals(signum).name}), stopping every rank\n")
        if current:
            current[0].stop(signum)
            remove_job_segments(current[0].job)
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    restart = 0
    while True:
        job = Job(args, command, restart, outputs)
        current[:] = [job]
        job.start()
        code = job.watch()
        if code == 0 or code in _FINAL or restart >= args.max_restarts:
            if code and args.max_restarts:
                err.say(f"{PROG}: the job failed after {restart} restart{'s' * (restart != 1)}"
                        f"{' (exit 2: not restarted)' if code in _FINAL else ''}; giving up\n")
            return code
        restart += 1
        err.say(f"{PROG}: restarting every rank ({restart} of {args.max_restarts}, "
                f"{RESTART_VARIABLE}={restart})\n")


if __name__ == "__main__":
    sys.exit(main())
