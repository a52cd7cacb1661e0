"""A one-node Slurm of the tests' own: a slurm.conf in a temporary directory, slurmctld and slurmd, torn down after.

Debian's ``slurm-wlm`` runs as root with ``AuthType=auth/none`` (no munge), on ports picked free,
with its state, spool, logs and pid files in the directory given. :func:`why_not` says why such a
Slurm cannot be started here (None when it can); :class:`OneNodeSlurm` starts it, waits until the
node is idle and stops both daemons for sure (SIGTERM, a wait, then SIGKILL to the whole process
group, since a slurmd has been seen to ignore SIGTERM while holding a defunct child).

    python -m tests.slurm.daemons -- srun -n 2 hostname     # by hand: up, run one command, down
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("srun", "sinfo", "scontrol")
#: CPUs the node announces (more than this machine may have: ``config_overrides`` lets tests start 3 or 4 tasks).
NODE_CPUS = 8
START_S = 60.0
STOP_S = 10.0


def why_not() -> str | None:
    """None when a one-node Slurm can be started here, else the reason."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name, path=_path()) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install slurm-wlm)"
    if os.geteuid() != 0:
        return "not root: the tests' Slurm runs its daemons as root (SlurmUser=root, AuthType=auth/none)"
    return None


def _path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on this machine now."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def slurm_conf(root: Path, host: str, ctl_port: int, slurmd_port: int) -> str:
    """The text of a slurm.conf for one node called ``host``, every file under ``root``."""
    return "\n".join([
        "ClusterName=npddptest",
        f"SlurmctldHost={host}",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/none", "CredType=cred/none",
        f"SlurmctldPort={ctl_port}", f"SlurmdPort={slurmd_port}",
        f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd.log",
        "ProctrackType=proctrack/pgid", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none", "MailProg=/bin/true",
        f"NodeName={host} CPUs={NODE_CPUS} State=UNKNOWN",
        f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


class OneNodeSlurm:
    """slurmctld and slurmd for one node named after this host, configured under ``root``."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.procs: list[subprocess.Popen] = []
        self.started = 0                         # clock ticks since boot when start() began

    @property
    def env(self) -> dict:
        """The environment a client (srun, sinfo) needs to talk to this Slurm."""
        return dict(os.environ, SLURM_CONF=str(self.conf), PATH=_path())

    def start(self) -> None:
        """Write the configuration, start both daemons, return once the node is idle; RuntimeError otherwise."""
        for sub in ("state", "spool"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.started = _started(Path("/proc/self"))
        ctl, slurmd = _free_ports(2)
        self.conf.write_text(slurm_conf(self.root, self.host, ctl, slurmd))
        for daemon in DAEMONS:
            args = [shutil.which(daemon, path=_path()), "-D", "-f", str(self.conf)]
            args += ["-i"] if daemon == "slurmctld" else ["-N", self.host]
            log = open(self.root / f"{daemon}.out", "wb")
            self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                               start_new_session=True))
            log.close()
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            state = self.node_state()
            if state.startswith("idle"):
                return
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited at start: {self.log_tail()}")
            time.sleep(0.3)
        raise RuntimeError(f"the node did not become idle in {START_S:.0f} s (state {state!r}): {self.log_tail()}")

    def node_state(self) -> str:
        """The node's state as sinfo prints it ('' when slurmctld does not answer)."""
        got = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env,
                             timeout=20)
        return got.stdout.strip() if got.returncode == 0 else ""

    def log_tail(self, n: int = 1500) -> str:
        """The end of both daemons' logs, for an error message."""
        text = []
        for daemon in DAEMONS:
            for name in (f"{daemon}.log", f"{daemon}.out"):
                path = self.root / name
                if path.exists():
                    text.append(f"[{name}] " + path.read_text(errors="replace")[-n:])
        return "\n".join(text)

    def stop(self) -> None:
        """End both daemons and everything they started: SIGTERM, wait, then SIGKILL to their process groups."""
        for proc in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)   # also any step daemon or task left in the group
            proc.wait()
        self.procs = []
        for _ in range(int(STOP_S / 0.1)):     # step daemons leave the group; they started after our slurmctld
            left = self.leftovers()
            if not left:
                break
            for pid in left:
                _kill(pid)
            time.sleep(0.1)

    def leftovers(self) -> list[int]:
        """slurmstepd processes started since this Slurm's slurmctld, or still holding its SLURM_CONF."""
        found, mark = [], f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            try:
                if not entry.name.isdigit() or int(entry.name) == os.getpid():
                    continue
                ours = mark in (entry / "environ").read_bytes().split(b"\0")
                if (entry / "comm").read_text().strip() == "slurmstepd" and _started(entry) >= self.started:
                    ours = True
            except OSError:
                continue
            if ours:
                found.append(int(entry.name))
        return found

    def __enter__(self) -> "OneNodeSlurm":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _started(proc_dir: Path) -> int:
    """When a process started, in clock ticks since boot (field 22 of /proc/PID/stat)."""
    return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[19])


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def main(argv=None) -> int:
    """Bring the one-node Slurm up, run the command after ``--`` with SLURM_CONF set, bring it down."""
    argv = sys.argv[1:] if argv is None else argv
    command = argv[argv.index("--") + 1:] if "--" in argv else argv
    if not command:
        print("usage: python -m tests.slurm.daemons -- COMMAND...", file=sys.stderr)
        return 2
    reason = why_not()
    if reason:
        print(f"error: slurm cannot be started: {reason}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="slurmtest-"))
    try:
        with OneNodeSlurm(root) as slurm:
            return subprocess.run(command, env=slurm.env).returncode
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
