"""Emulated nodes: one network namespace per node (host name ``node<i>``), a veth to a bridge in its own namespace.

    node0 [eth0 10.77.0.1] ---- v0 \
    node1 [eth0 10.77.0.2] ---- v1 -- br0   (namespace <prefix>-br)
    ...

Addresses come from :data:`BLOCK` and exist only in the namespaces made here, which have no
route anywhere else: what a node sends reaches another node or nothing. Each link is shaped in
both directions (``eth0`` egress is the node's upload, ``v<i>`` egress its download). A
command runs on a node through :meth:`Cluster.node_command`: ``ip netns exec`` (which also
shows the node's ``/etc/netns/<ns>/hosts`` as /etc/hosts, so node names resolve) then a UTS
namespace of its own whose host name is the node's, so npddp's node detection sees a node.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import subprocess
from dataclasses import dataclass

from npddp.cluster import shaping, state

#: The private block every cluster's addresses come from (node i is host i+1).
BLOCK = ipaddress.ip_network("10.77.0.0/24")
MAX_NODES = BLOCK.num_addresses - 3
#: Namespace names start with this, then the cluster id.
PREFIX = "npddp"
#: The node's interface name inside its namespace.
DEVICE = "eth0"


class ClusterError(RuntimeError):
    """A command that builds or runs the cluster failed; the message is one line."""


def sh(argv: list[str]) -> None:
    """Run one setup command; ClusterError with its own error line when it fails."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise ClusterError(f"{' '.join(argv)}: {reason}")


@dataclass
class Cluster:
    """K nodes on one bridge; its names follow from ``cid``."""

    cid: str
    nodes: int
    rate: float | None = None
    delay: float | None = None
    mtu: int = 1500

    @classmethod
    def new(cls, nodes: int, **kw) -> "Cluster":
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes {nodes} is out of range; valid: 1..{MAX_NODES}")
        return cls(secrets.token_hex(3), nodes, **kw)

    def host(self, i: int) -> str:
        return f"node{i}"

    def netns(self, i: int) -> str:
        return f"{PREFIX}-{self.cid}-n{i}"

    @property
    def bridge_netns(self) -> str:
        return f"{PREFIX}-{self.cid}-br"

    def address(self, i: int) -> str:
        return str(BLOCK.network_address + i + 1)

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_netns] + [self.netns(i) for i in range(self.nodes)]

    def record(self, runtime: str, owner: int) -> state.Record:
        """The state record naming everything :meth:`up` makes."""
        return state.Record(self.cid, self.namespaces, [os.path.join(state.ETC_NETNS, self.netns(i))
                                                        for i in range(self.nodes)], runtime, owner,
                            state.start_time(owner) or 0 if owner else 0,
                            {"nodes": self.nodes, "rate": self.rate, "delay": self.delay, "mtu": self.mtu})

    def up_bridge(self) -> None:
        """The bridge's namespace and the bridge (first, so netem can be tried before any node exists)."""
        br = self.bridge_netns
        sh(["ip", "netns", "add", br])
        sh(["ip", "-n", br, "link", "add", "br0", "mtu", str(self.mtu), "type", "bridge"])
        sh(["ip", "-n", br, "link", "set", "br0", "up"])

    def up_nodes(self) -> None:
        """Every node: namespace, veth to the bridge, address, shaping both ways, host name file."""
        br = self.bridge_netns
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.address(i)} {self.host(i)}\n" for i in range(self.nodes))
        for i in range(self.nodes):
            ns, peer = self.netns(i), f"v{i}"
            os.makedirs(os.path.join(state.ETC_NETNS, ns), exist_ok=True)
            with open(os.path.join(state.ETC_NETNS, ns, "hosts"), "w") as f:
                f.write(hosts)
            sh(["ip", "netns", "add", ns])
            sh(["ip", "link", "add", DEVICE, "netns", ns, "mtu", str(self.mtu), "type", "veth",
                "peer", "name", peer, "netns", br, "mtu", str(self.mtu)])
            sh(["ip", "-n", br, "link", "set", peer, "master", "br0"])
            sh(["ip", "-n", br, "link", "set", peer, "up"])
            sh(["ip", "-n", ns, "addr", "add", f"{self.address(i)}/{BLOCK.prefixlen}", "dev", DEVICE])
            sh(["ip", "-n", ns, "link", "set", DEVICE, "up"])
            sh(["ip", "-n", ns, "link", "set", "lo", "up"])
            for where, dev in ((ns, DEVICE), (br, peer)):
                for cmd in shaping.qdisc_commands(dev, self.rate, self.delay, self.mtu):
                    sh(["ip", "netns", "exec", where, *cmd])

    def node_command(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run on node ``i``: in its network namespace, with its host name."""
        return ["ip", "netns", "exec", self.netns(i), "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.host(i), *argv]
