"""What a cluster made, written down before it is made, so that whatever kills the harness, the next run can undo it.

One JSON file per cluster in the state directory (``/run/npddp-cluster``, else the temp dir):
its namespaces, its ``/etc/netns`` directories and its runtime directory, and the harness that
owns it (pid and start time; none for a cluster made by ``up``, which lives until ``down``).
A cluster whose owner is gone is a leftover: :func:`remove` kills the processes still in its
namespaces and deletes everything named in the file, then the file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field

from npddp.util import variables

#: Where ``ip netns exec`` finds per-namespace files (``hosts``) to show as /etc/...
ETC_NETNS = "/etc/netns"


def state_dir() -> str:
    """The directory of the state files: ``NPDDP_CLUSTER_STATE``, else /run/npddp-cluster, else the temp dir."""
    chosen = variables.text(variables.CLUSTER_STATE)
    if chosen:
        return chosen
    return "/run/npddp-cluster" if os.access("/run", os.W_OK) else os.path.join(tempfile.gettempdir(), "npddp-cluster")


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (None when it is gone): pid plus this names it uniquely."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Record:
    """What one cluster made: written before making it, removed after undoing it."""

    cid: str
    namespaces: list[str]
    etc_dirs: list[str]
    runtime: str
    owner_pid: int = 0          # 0: made by ``up``, owned by nobody until ``down``
    owner_start: int = 0
    info: dict = field(default_factory=dict)

    @property
    def path(self) -> str:
        return os.path.join(state_dir(), f"{self.cid}.json")

    def owned(self) -> bool:
        """True while the harness that made it runs (always False for a cluster made by ``up``)."""
        return bool(self.owner_pid) and start_time(self.owner_pid) == self.owner_start

    def save(self) -> None:
        os.makedirs(state_dir(), exist_ok=True)
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(asdict(self), f)
        os.replace(tmp, self.path)


def load_all() -> list[Record]:
    """Every cluster the state directory names (a file that cannot be read is skipped)."""
    found = []
    try:
        names = sorted(os.listdir(state_dir()))
    except OSError:
        return found
    for name in names:
        if name.endswith(".json"):
            try:
                with open(os.path.join(state_dir(), name)) as f:
                    found.append(Record(**json.load(f)))
            except (OSError, ValueError, TypeError):
                continue
    return found


def existing_namespaces() -> set[str]:
    """The named network namespaces (``ip netns list``)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def namespace_pids(netns: str) -> list[int]:
    """The processes living in network namespace ``netns``."""
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_namespace_processes(namespaces: list[str], grace: float = 2.0) -> None:
    """SIGTERM every process in ``namespaces``, then SIGKILL what is still there after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        pids = [p for ns in namespaces for p in namespace_pids(ns)]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(namespace_pids(ns) for ns in namespaces):
            time.sleep(0.05)


def remove(record: Record, grace: float = 2.0) -> list[str]:
    """Undo everything ``record`` names that still exists; the names of what was removed."""
    live = existing_namespaces()
    namespaces = [ns for ns in record.namespaces if ns in live]
    kill_namespace_processes(namespaces, grace)
    removed = []
    for ns in namespaces:
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        removed.append(ns)
    for path in [*record.etc_dirs, record.runtime]:
        if path and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    try:
        os.unlink(record.path)
    except FileNotFoundError:
        pass
    return removed


def remove_leftovers(include_up: bool = False) -> list[str]:
    """Remove every cluster whose owner is gone (and those made by ``up`` if ``include_up``); what was removed."""
    removed = []
    for record in load_all():
        if record.owned() or (not record.owner_pid and not include_up):
            continue
        removed += remove(record)
    return removed
