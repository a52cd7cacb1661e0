"""Bring up K emulated nodes, run a job across them, tear them down, and exit with the job's code.

    python -m npddp.cluster --nodes 2 --ranks-per-node 2 --rate 1gbit --launcher tcp -- python -m npddp.train --backend hier
    python -m npddp.cluster --nodes 4 --rate 10gbit --launcher mpi -- python benchmarks/allreduce.py
    python -m npddp.cluster up --nodes 2 --rate 1gbit      # interactive: prints the cluster's id
    python -m npddp.cluster exec --node 1 -- hostname      # a command on node1 (of the only cluster, or --cluster ID)
    python -m npddp.cluster status                         # clusters, owners, namespaces
    python -m npddp.cluster down                           # remove clusters made by up, and any leftovers

Needs CAP_NET_ADMIN (root). Everything a cluster makes is named in a state file first, so
namespaces, links and processes are gone after the job, Ctrl-C, a killed rank, and (at the next
run or ``down``) a harness killed with SIGKILL; the /dev/shm files the job's processes mapped
and nobody maps any more are removed at the end too.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time

from npddp.cluster import launch, shaping, state
from npddp.cluster.topology import MAX_NODES, Cluster, ClusterError
from npddp.process import cleanup
from npddp.util import variables

PROG = "python -m npddp.cluster"
EXIT_USAGE = 2
_CAP_NET_ADMIN = 12
_FORMS = ("up", "exec", "down", "status")


def _say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def _shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=2, metavar="K", help=f"emulated nodes, 1..{MAX_NODES} (default: 2)")
    p.add_argument("--rate", default="1gbit", help="each link's rate in each direction, tc syntax (e.g. 100mbit, "
                                                   "10gbit), or none: unshaped (default: 1gbit)")
    p.add_argument("--mtu", type=int, default=1500, help="the links' MTU, 576..65535 (default: 1500)")
    p.add_argument("--delay", default=None, help="one-way delay per link, e.g. 1ms (needs the kernel's netem)")


def _parser(form: str | None) -> argparse.ArgumentParser:
    if form is None:
        p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                    usage=f"{PROG} [options] -- COMMAND ...  |  {PROG} {{up,exec,down,status}} ...",
                                    formatter_class=argparse.RawDescriptionHelpFormatter,
                                    epilog="\n\n".join(__doc__.split("\n\n")[1:]))
        _shape_args(p)
        p.add_argument("--ranks-per-node", type=int, default=1, metavar="R", help="ranks on each node (default: 1)")
        p.add_argument("--launcher", choices=("tcp", "mpi"), default="tcp",
                       help="tcp: python -m npddp.run on every node; mpi: the launcher of the MPI library mpi4py "
                            "loads (MPICH, Open MPI, Intel MPI) (default: tcp)")
        p.add_argument("--grace", type=float, default=3.0, metavar="SECONDS",
                       help="after a failure, seconds the other ranks get before SIGKILL (default: 3)")
        return p
    p = argparse.ArgumentParser(prog=f"{PROG} {form}")
    if form == "up":
        _shape_args(p)
    elif form == "exec":
        p.add_argument("--cluster", default=None, help="the cluster's id (default: the only one made by up)")
        p.add_argument("--node", type=int, default=0, help="the node to run on (default: 0)")
    elif form == "down":
        p.add_argument("cid", nargs="?", default=None, help="one cluster's id (default: every one not in use)")
    return p


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """Options before ``--``, the command after it."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _check_shape(p, args) -> None:
    if not 1 <= args.nodes <= MAX_NODES:
        p.error(f"--nodes {args.nodes} is out of range; valid: 1..{MAX_NODES}")
    if not 576 <= args.mtu <= 65535:
        p.error(f"--mtu {args.mtu} is out of range; valid: 576..65535")
    try:
        args.rate_bits = shaping.parse_rate(args.rate)
        args.delay_s = None if args.delay is None else shaping.parse_delay(args.delay)
    except ValueError as exc:
        p.error(str(exc))


def missing_privilege() -> str | None:
    """None when this process may make namespaces and links, else one line saying what is missing."""
    for tool in ("ip", "tc", "unshare"):
        if not shutil.which(tool):
            return f"the {tool!r} command is missing (iproute2 / util-linux)"
    try:
        with open("/proc/self/status") as f:
            caps = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        caps = 0
    if not caps >> _CAP_NET_ADMIN & 1:
        return "needs CAP_NET_ADMIN to make network namespaces and links (run as root)"
    return None


class Interrupted(Exception):
    """A signal asked the harness to stop."""


def _raise_on(signum, frame):
    raise Interrupted(signum)


def _die_with_parent() -> None:
    """In a child, before exec: SIGKILL when the harness dies, so no launcher outlives it."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _start(argv: list[str], env=None) -> subprocess.Popen:
    return subprocess.Popen(argv, env=env, start_new_session=True, preexec_fn=_die_with_parent)


def _signal_groups(procs, sig) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass


def _code(code: int) -> int:
    return 128 - code if code < 0 else code


def note_segments(procs: list[subprocess.Popen], seen: set) -> None:
    """Add to ``seen`` the /dev/shm files the launchers' processes map (MPI's, which a killed job leaves)."""
    for proc in procs:
        for pid in cleanup.descendants(proc.pid):
            seen |= cleanup.mapped_segments(pid)


def watch(procs: list[subprocess.Popen], grace: float, seen: set) -> int:
    """Wait for every launcher; when one fails, stop the others. The job's code (0 when none failed).

    A failed node's peers exit 1 (their connections broke), sometimes before the failed node's
    launcher reports; of the failures within :data:`_SETTLE_S`, a code other than 1 is the cause.
    Meanwhile the shared-memory files the job maps are noted in ``seen``.
    """
    settle, scanned = None, 0.0
    while any(p.poll() is None for p in procs) and (settle is None or time.monotonic() < settle):
        if settle is None and any(p.poll() for p in procs):
            settle = time.monotonic() + _SETTLE_S
        if time.monotonic() - scanned > _SCAN_S:
            note_segments(procs, seen)
            scanned = time.monotonic()
        time.sleep(0.02)
    codes = [p.returncode for p in procs if p.poll()]
    if not codes:
        return 0
    _signal_groups(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    _signal_groups(procs, signal.SIGKILL)
    for p in procs:
        p.wait()
    return _code(next((c for c in codes if c != 1), codes[0]))


#: Seconds between two looks at the /dev/shm files the job maps.
_SCAN_S = 0.25
#: Seconds after the first failure during which a more specific one (a signal, a code other than 1) is awaited.
_SETTLE_S = 0.5


def _cleanup_leftovers() -> None:
    removed = state.remove_leftovers()
    if removed:
        _say(f"removed leftovers of an earlier run that was killed: {', '.join(removed)}")


def _bring_up(cluster: Cluster, owner: int) -> state.Record:
    """Write the record, then make the cluster (the record names everything first)."""
    runtime = os.path.join(state.state_dir(), cluster.cid)
    record = cluster.record(runtime, owner)
    record.save()
    os.makedirs(runtime, exist_ok=True)
    cluster.up_bridge()
    if cluster.delay is not None:
        reason = shaping.netem_missing(cluster.bridge_netns)
        if reason:
            raise ClusterError(f"--delay needs the kernel's netem queueing discipline, which is missing ({reason})")
    cluster.up_nodes()
    return record


def _links_crossed(cluster: Cluster, lib, launcher: str, runtime: str, env: dict, procs: list) -> bool:
    """Run the start-up check (kept in ``procs`` so a signal stops it); False after it refused or failed."""
    procs[:] = [_start(launch.probe_command(cluster, lib, launcher, runtime), env)]
    code = procs[0].wait(timeout=120)
    if code and code != launch.PROBE_REFUSED:   # a refusal printed its own line; else the library spoke, above
        _say(f"{lib.name}'s start-up check between node0 and node1 failed (exit {_code(code)})")
    return not code


def run(args) -> int:
    """The run form: up, (probe,) job, teardown; the job's exit code."""
    lib = launcher = None
    if args.launcher == "mpi":
        try:
            lib = launch.active_library()
            launcher = launch.find_launcher(lib)
        except launch.LauncherError as exc:
            _say(str(exc))
            return EXIT_USAGE
    _cleanup_leftovers()
    cluster = Cluster.new(args.nodes, rate=args.rate_bits, delay=args.delay_s, mtu=args.mtu)
    procs: list[subprocess.Popen] = []
    record, seen, before = None, set(), cleanup.segment_files()
    old = {s: signal.signal(s, _raise_on) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        record = _bring_up(cluster, os.getpid())
        tmp = os.path.join(record.runtime, "tmp")   # the job's temporary files go with the cluster, even after SIGKILL
        os.makedirs(tmp, mode=0o700, exist_ok=True)
        if args.launcher == "tcp":
            secret = variables.text(variables.JOB_SECRET) or secrets.token_hex(32)
            env = {**os.environ, variables.JOB_SECRET.name: secret, "TMPDIR": tmp}
            procs = [_start(c, env) for c in launch.tcp_commands(cluster, args.ranks_per_node, args.command,
                                                                 args.grace)]
        else:
            env = {**launch.mpi_env(lib, record.runtime), "TMPDIR": tmp}
            launch.write_stand_in(cluster, record.runtime)
            if cluster.nodes > 1 and not _links_crossed(cluster, lib, launcher, record.runtime, env, procs):
                return EXIT_USAGE
            procs[:] = [_start(launch.mpi_command(cluster, lib, launcher, record.runtime, args.ranks_per_node,
                                                  args.command), env)]
        return watch(procs, args.grace, seen)
    except Interrupted as exc:
        for s in old:
            signal.signal(s, signal.SIG_IGN)   # a second Ctrl-C must not cut the stop and the teardown short
        _say(f"got {signal.Signals(exc.args[0]).name}, stopping the job and removing the cluster")
        _signal_groups(procs, exc.args[0])
        deadline = time.monotonic() + args.grace
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.05)
        return 128 + exc.args[0]
    except ClusterError as exc:
        _say(str(exc))
        return EXIT_USAGE
    except subprocess.TimeoutExpired:
        _say("the start-up check of MPI across the links did not finish in 120 s")
        return EXIT_USAGE
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)   # teardown must finish even if Ctrl-C is pressed again
        _signal_groups(procs, signal.SIGKILL)
        state.remove(record or cluster.record(os.path.join(state.state_dir(), cluster.cid), 0), grace=args.grace)
        # what MPI left in /dev/shm when a rank was killed (none after a clean end): what the job was seen to map,
        # and what appeared while it ran that nothing maps now (a job may die between two looks at its maps)
        cleanup.remove_unused(seen | (cleanup.segment_files() - before))
        for s, handler in old.items():
            signal.signal(s, handler)


def up(args) -> int:
    _cleanup_leftovers()
    cluster = Cluster.new(args.nodes, rate=args.rate_bits, delay=args.delay_s, mtu=args.mtu)
    try:
        _bring_up(cluster, 0)
    except ClusterError as exc:
        _say(str(exc))
        state.remove(cluster.record(os.path.join(state.state_dir(), cluster.cid), 0))
        return EXIT_USAGE
    nodes = ", ".join(f"{cluster.host(i)} {cluster.address(i)}" for i in range(cluster.nodes))
    print(f"cluster {cluster.cid} up: {nodes}; {PROG} exec --cluster {cluster.cid} --node I -- CMD; "
          f"{PROG} down {cluster.cid}")
    return 0


def _records(cid: str | None) -> list[state.Record]:
    return [r for r in state.load_all() if cid is None or r.cid == cid]


def execute(args) -> int:
    made = [r for r in _records(args.cluster) if not r.owner_pid or args.cluster]
    if len(made) != 1:
        _say(f"exec needs one cluster; found {len(made)} (name one with --cluster ID; see {PROG} status)")
        return EXIT_USAGE
    record = made[0]
    cluster = Cluster(record.cid, record.info["nodes"])
    if not 0 <= args.node < cluster.nodes:
        _say(f"--node {args.node} is out of range; valid: 0..{cluster.nodes - 1}")
        return EXIT_USAGE
    if not args.command:
        _say("exec needs a command after --")
        return EXIT_USAGE
    return _code(subprocess.call(cluster.node_command(args.node, args.command)))


def down(args) -> int:
    if args.cid is None:
        removed = state.remove_leftovers(include_up=True)
    else:
        found = _records(args.cid)
        if not found:
            _say(f"no cluster {args.cid!r}; see {PROG} status")
            return EXIT_USAGE
        removed = [name for r in found for name in state.remove(r)]
    print(f"removed: {', '.join(removed)}" if removed else "nothing to remove")
    return 0


def status(args) -> int:
    live = state.existing_namespaces()
    records = state.load_all()
    for r in records:
        owner = "made by up" if not r.owner_pid else ("running" if r.owned() else "leftover (owner gone)")
        present = sum(ns in live for ns in r.namespaces)
        print(f"{r.cid}: {r.info.get('nodes')} nodes, rate {shaping.format_rate(r.info.get('rate'))}, {owner}, "
              f"{present}/{len(r.namespaces)} namespaces present")
    if not records:
        print("no clusters")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    form = argv[0] if argv and argv[0] in _FORMS else None
    options, command = _split(argv[1:] if form else argv)
    p = _parser(form)
    args = p.parse_args(options)
    args.command = command
    if form in (None, "up"):
        _check_shape(p, args)
    if form is None:
        if args.ranks_per_node < 1:
            p.error(f"--ranks-per-node {args.ranks_per_node} is out of range; valid: 1 or more")
        if not 0 < args.grace < 3600:
            p.error(f"--grace {args.grace} is out of range; valid: 0 < seconds < 3600")
        if not command:
            p.error("no command given: put it after --")
        if args.launcher == "tcp":
            try:
                launch.tcp_program(command)
            except ValueError as exc:
                p.error(str(exc))
    reason = missing_privilege() if form != "status" else None
    if reason:
        _say(reason)
        return EXIT_USAGE
    return {None: run, "up": up, "exec": execute, "down": down, "status": status}[form](args)


if __name__ == "__main__":
    sys.exit(main())
