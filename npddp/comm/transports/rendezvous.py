"""How TCP ranks find each other: where each stands, a table from rank 0, a full mesh.

Every rank knows where it stands from its launcher (:mod:`~npddp.comm.transports.launch_env`:
torchrun's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, Slurm's variables or MPI). Then:

1. every rank opens a listening socket of its own on an ephemeral port;
2. rank 0 listens on ``MASTER_ADDR:MASTER_PORT``; every other rank connects there (retrying
   until the timeout, since rank 0 may start later) and registers its rank, the world size, its
   listening address and its host name;
3. once all have registered, rank 0 sends every rank the table of all of them, with a job
   token, and closes the rendezvous;
4. each rank connects to every lower rank's listener and accepts a connection from every higher
   rank. Connecting never waits for the peer to accept (the listener's backlog holds the
   connection), so this order cannot deadlock. Each connection starts with a handshake naming
   the rank and the job token, so a stray connection is refused.

Every connection, at ``MASTER_PORT`` and between ranks, first proves it holds the job's secret
(``NPDDP_JOB_SECRET``) with the challenge-response of :mod:`~npddp.comm.transports.handshake`;
one that does not is dropped with one line and the rendezvous goes on. Rank 0 listens on
``MASTER_ADDR`` only (``NPDDP_LISTEN_ADDR=0.0.0.0`` to listen on every interface). Without a
secret the world forms only on a loopback ``MASTER_ADDR``, and rank 0 listens on loopback only:
across machines, or with ``NPDDP_LISTEN_ADDR`` beyond loopback, it is refused.

The result is one connected, non-blocking, ``TCP_NODELAY`` socket per peer, wrapped in a
:class:`~npddp.comm.transports.tcp.TCPWorld` once per process (:func:`npddp.comm.transports.world.world_from_env`). Every message
here is fixed-size binary (``struct``); nothing is pickled.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import struct
import sys
import time

from npddp.comm.transports import handshake
from npddp.comm.transports.launch_env import NAME_BYTES, LaunchEnv, encode_name
from npddp.util import variables

MAGIC = b"NPDD"
VERSION = 2
REGISTER = struct.Struct(f"<4sIII{NAME_BYTES}sH{NAME_BYTES}s{NAME_BYTES}s")  # magic, version, rank, size, ip, port,
                                                                             # host, the job's identity
TABLE_HEAD = struct.Struct("<4sIQI")                            # magic, status (0 ok), token, error length
ENTRY = struct.Struct(f"<{NAME_BYTES}sH{NAME_BYTES}s")          # ip, port, host
HELLO = struct.Struct("<4sIQ")                                  # magic, rank, token
_RETRY_S = 0.1
_ERROR_MAX = 1024                                               # bytes of an error message from rank 0
LISTEN_VARIABLE = variables.LISTEN_ADDR.name


class RendezvousError(ConnectionError):
    """The ranks could not find each other: one line saying who, where and why."""




def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode(errors="replace")


def _recv_exact(sock: socket.socket, n: int, deadline: float, what: str) -> bytes:
    """Exactly ``n`` bytes from a blocking socket, before ``deadline``; RendezvousError otherwise."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            k = sock.recv_into(view[got:])
        except socket.timeout:
            raise RendezvousError(f"timed out waiting for {what}") from None
        if not k:
            raise RendezvousError(f"connection closed while waiting for {what}")
        got += k
    return bytes(buf)


def _listener(host: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def _connect(addr: str, port: int, deadline: float, who: str) -> socket.socket:
    """Connect to ``addr:port``, retrying refused connections until ``deadline``."""
    last = None
    while True:
        try:
            return socket.create_connection((addr, port), timeout=max(0.01, deadline - time.monotonic()))
        except OSError as exc:
            last = exc
        if time.monotonic() + _RETRY_S > deadline:
            raise RendezvousError(f"could not reach {who} at {addr}:{port} ({last.strerror or last}): is it "
                                  "running, and are MASTER_ADDR/MASTER_PORT the same on every rank?")
        time.sleep(_RETRY_S)


def _serve_table(server: socket.socket, env: LaunchEnv, me: tuple, deadline: float) -> tuple[int, list]:
    """Rank 0: collect every rank's registration (each proven by the handshake), then send everyone the table."""
    size = env.world_size
    entries: list = [None] * size
    entries[0] = me
    clients: list = []
    error = ""
    gate = handshake.Gate(server, env.secret, REGISTER.size, f"rank 0 at {env.master_addr}:{env.master_port}")
    try:
        while any(e is None for e in entries) and not error:
            got = gate.accept(deadline)
            if got is None:
                missing = [r for r, e in enumerate(entries) if e is None]
                raise RendezvousError(f"rank 0 waited for ranks {missing} to register at "
                                      f"{env.master_addr}:{env.master_port} until the timeout")
            conn, raw, _ = got
            magic, version, rank, wsize, ip, port, host, job = REGISTER.unpack(raw)
            if magic == MAGIC and version == VERSION and job.rstrip(b"\0") != _job_bytes(env.job):
                _refuse(conn, env, rank, _text(job))   # another job's rank: it ends, this job goes on waiting
                continue
            clients.append(conn)
            if magic != MAGIC or version != VERSION:
                error = f"a process that is not an npddp rank of this version connected to port {env.master_port}"
            elif wsize != size:
                error = f"rank {rank} has WORLD_SIZE={wsize} but rank 0 has WORLD_SIZE={size}"
            elif not 0 < rank < size or entries[rank] is not None:
                error = f"two processes claim RANK={rank}" if 0 <= rank < size else f"RANK={rank} is out of range"
            else:
                entries[rank] = (_text(ip), port, _text(host))
        token = secrets.randbits(63)
        message = error.encode()[:_ERROR_MAX]
        reply = TABLE_HEAD.pack(MAGIC, 1 if error else 0, token, len(message)) + message
        if not error:
            reply += b"".join(ENTRY.pack(encode_name(ip), port, encode_name(host)) for ip, port, host in entries)
        for conn in clients:
            try:
                conn.sendall(reply)
            except OSError as exc:
                error = error or f"a registered rank closed its connection to rank 0 ({exc.strerror or exc})"
    finally:
        gate.close()
        for conn in clients:
            conn.close()
    if error:
        raise RendezvousError(error)
    return token, entries


def _job_name(job: str) -> str:
    return job or "a job its launcher names not"


def _refuse(conn: socket.socket, env: LaunchEnv, rank: int, job: str) -> None:
    """Rank 0: tell a registering rank of another job why it is refused (one line each side), and close."""
    where = f"{env.master_addr}:{env.master_port}"
    sys.stderr.write(f"npddp: rank 0 at {where}: refused rank {rank} of {_job_name(job)}: this is "
                     f"{_job_name(env.job)}\n")
    message = (f"rank 0 at {where} belongs to {_job_name(env.job)}, not to this rank's {_job_name(job)}: two jobs "
               f"chose one rendezvous port; give each job its own MASTER_PORT (docs/guide/slurm.md: how ports are "
               f"chosen)").encode()[:_ERROR_MAX]
    try:
        conn.sendall(TABLE_HEAD.pack(MAGIC, 1, 0, len(message)) + message)
    except OSError:
        pass
    conn.close()


def _fetch_table(env: LaunchEnv, me_host: str, listener: socket.socket, deadline: float):
    """Ranks > 0: register with rank 0 (after proving the job secret) and receive the table."""
    where = f"{env.master_addr}:{env.master_port}"
    sock = _connect(env.master_addr, env.master_port, deadline, "rank 0")
    with sock:
        ip = sock.getsockname()[0]
        listener.bind((ip, 0))
        listener.listen(env.world_size)
        port = listener.getsockname()[1]
        try:
            handshake.knock(sock, env.secret, REGISTER.pack(MAGIC, VERSION, env.rank, env.world_size, encode_name(ip),
                                                            port, encode_name(me_host), _job_bytes(env.job)),
                            f"rank 0 at {where}", deadline)
            magic, status, token, nerr = TABLE_HEAD.unpack(
                _recv_exact(sock, TABLE_HEAD.size, deadline, "the rank table"))
            if magic != MAGIC or nerr > _ERROR_MAX:
                raise RendezvousError(f"{where} is not an npddp rank 0 (malformed rank table)")
            if status:
                raise RendezvousError(_recv_exact(sock, nerr, deadline, "the error").decode(errors="replace"))
            raw = _recv_exact(sock, ENTRY.size * env.world_size, deadline, "the rank table")
        except handshake.HandshakeError as exc:
            raise RendezvousError(str(exc)) from None
    entries = [ENTRY.unpack_from(raw, r * ENTRY.size) for r in range(env.world_size)]
    return token, [(_text(ip), port, _text(host)) for ip, port, host in entries]


def _job_bytes(job: str) -> bytes:
    """The job's identity for a registration: at most NAME_BYTES bytes (a longer one is cut; both sides cut alike)."""
    return job.encode()[:NAME_BYTES]


def _resolve(addr: str) -> str:
    """``addr`` as an IP address; RendezvousError in one line when it does not resolve."""
    if ":" in addr:
        return addr
    try:
        return socket.gethostbyname(addr)
    except OSError as exc:
        raise RendezvousError(f"MASTER_ADDR={addr!r} does not resolve ({exc.strerror or exc})") from None


def is_loopback(addr: str) -> bool:
    """True when ``addr`` names this machine's loopback interface."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(addr) if ":" not in addr else addr).is_loopback
    except (OSError, ValueError):
        return False


def _bind_address(addr: str, environ=None) -> str:
    """Where rank 0 listens: ``MASTER_ADDR`` itself, unless ``NPDDP_LISTEN_ADDR`` says otherwise."""
    chosen = variables.text(variables.LISTEN_ADDR, environ)
    if chosen:
        return "" if chosen in ("0.0.0.0", "::", "*") else chosen
    return _resolve(addr)


def listen_refusal(secret, environ=None) -> str | None:
    """Why ``NPDDP_LISTEN_ADDR`` may not be used by a job without a secret (one line), or None when it may."""
    chosen = variables.text(variables.LISTEN_ADDR, environ)
    if secret or not chosen or is_loopback(chosen):
        return None
    return (f"{LISTEN_VARIABLE}={chosen!r} would accept ranks from other machines, but the job has no secret "
            f"({handshake.SECRET_VARIABLE}); valid without a secret: a loopback address (127.0.0.0/8 or ::1), "
            f"else give every rank the same secret (python -m npddp.run --secret-file FILE)")


def connect(env: LaunchEnv, timeout: float) -> tuple[list, list[str]]:
    """Build the full mesh: one connected socket per peer (None for this rank), and every rank's host name."""
    deadline = time.monotonic() + min(timeout, 10 ** 9)
    host = socket.gethostname()[:NAME_BYTES]
    if env.world_size == 1:
        return [None], [host]
    listener = None
    try:
        if not env.secret and not is_loopback(env.master_addr):
            raise RendezvousError(f"no job secret: across machines (MASTER_ADDR={env.master_addr}) every rank "
                                  f"needs the same {handshake.SECRET_VARIABLE} (python -m npddp.run --secret-file "
                                  "FILE on every machine; under srun: export it in the job script, docs/guide/slurm.md)")
        refusal = listen_refusal(env.secret)
        if refusal:
            raise RendezvousError(refusal)
        listener = _listener(env.master_addr)
        if env.rank == 0:
            server = _listener(env.master_addr)
            with server:
                try:
                    server.bind((_bind_address(env.master_addr), env.master_port))
                except OSError as exc:
                    raise RendezvousError(f"rank 0 cannot listen on {env.master_addr}:{env.master_port} "
                                          f"({exc.strerror or exc}): choose another MASTER_PORT, or set "
                                          f"{LISTEN_VARIABLE} to an address of this machine") from None
                server.listen(max(env.world_size, 16))
                listener.bind((_resolve(env.master_addr), 0))
                listener.listen(max(env.world_size, 16))
                me = (listener.getsockname()[0], listener.getsockname()[1], host)
                token, table = _serve_table(server, env, me, deadline)
        else:
            token, table = _fetch_table(env, host, listener, deadline)
        socks = _mesh(env, table, token, listener, deadline)
    except RendezvousError as exc:
        raise RendezvousError(f"[rank {env.rank}] tcp rendezvous: {exc}") from None
    except OSError as exc:  # anything the network throws that no step above expected: still one line
        raise RendezvousError(f"[rank {env.rank}] tcp rendezvous: {type(exc).__name__}: {exc}") from None
    finally:
        if listener is not None:
            listener.close()
    return socks, [h for _, _, h in table]


def _mesh(env: LaunchEnv, table: list, token: int, listener: socket.socket, deadline: float) -> list:
    """Connect to every lower rank, accept every higher one (each link proven); return the sockets by rank."""
    socks: list = [None] * env.world_size
    gate = None
    try:
        for peer in range(env.rank):
            ip, port, _ = table[peer]
            sock = _connect(ip, port, deadline, f"rank {peer}")
            socks[peer] = sock
            try:
                handshake.knock(sock, env.secret, HELLO.pack(MAGIC, env.rank, token), f"rank {peer} at {ip}:{port}",
                                deadline)
            except handshake.HandshakeError as exc:
                raise RendezvousError(str(exc)) from None
        waiting = env.world_size - env.rank - 1
        if waiting:
            gate = handshake.Gate(listener, env.secret, HELLO.size, f"rank {env.rank}'s listener")
        while waiting:
            got = gate.accept(deadline)
            if got is None:
                missing = [r for r in range(env.rank + 1, env.world_size) if socks[r] is None]
                raise RendezvousError(f"ranks {missing} never connected")
            sock, raw, addr = got
            magic, peer, their_token = HELLO.unpack(raw)
            if magic != MAGIC or their_token != token or not env.rank < peer < env.world_size or socks[peer]:
                sock.close()  # a rank of this job, but of another rendezvous (e.g. before a restart)
                sys.stderr.write(f"npddp: rank {env.rank}'s listener: dropped {addr[0]}:{addr[1]}: it holds the "
                                 f"job secret but not this rendezvous's token (claims rank {peer})\n")
                continue
            socks[peer] = sock
            waiting -= 1
    except BaseException:
        for sock in socks:
            if sock is not None:
                sock.close()
        raise
    finally:
        if gate is not None:
            gate.close()
    for sock in socks:
        if sock is not None:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return socks
