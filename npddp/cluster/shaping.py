"""Link shaping with ``tc``: a rate (``tbf``) on each end of a link, and ``netem`` delay where the kernel has it.

Rates use tc's syntax (``100mbit``, ``1gbit``, ``10gbit``, ``125mbps``); ``none`` leaves a link
unshaped. Delay needs the ``netem`` queueing discipline: :func:`netem_missing` finds out by
trying it, so a ``--delay`` is never silently ignored.
"""

from __future__ import annotations

import re
import subprocess

#: Bits per second of each tc rate unit (tc: bit = bits/s, bps = bytes/s; k/m/g/t are powers of 1000).
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
          "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_DELAY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
#: Seconds of traffic one token bucket may send at once (at least 128 KiB, so a 64 KiB GSO packet fits).
_BURST_S, _MIN_BURST = 0.002, 128 << 10
#: Packets queued before tbf drops: enough for the bandwidth-delay product of every rate used here.
_LATENCY = "100ms"


def parse_rate(text: str) -> float | None:
    """Bits per second for a tc rate like ``1gbit`` (None for ``none``); ValueError naming the valid forms."""
    raw = str(text).strip().lower()
    if raw == "none":
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]+)", raw)
    if not m or m.group(2) not in _UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"rate {text!r} is not valid; valid: a positive number with a unit "
                         f"({', '.join(_UNITS)}), e.g. 1gbit, or none")
    bits = float(m.group(1)) * _UNITS[m.group(2)]
    if not 8e3 <= bits <= 1e12:
        raise ValueError(f"rate {text!r} is out of range; valid: 1kbps .. 1tbit")
    return bits


def format_rate(bits: float | None) -> str:
    """A rate in the words :func:`parse_rate` reads: ``1gbit`` for 1e9 bits/s, ``none`` for an unshaped link."""
    if bits is None:
        return "none"
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits >= _UNITS[unit]:
            return f"{bits / _UNITS[unit]:g}{unit}"
    return f"{bits:g}bit"


def parse_delay(text: str) -> float:
    """Seconds for a tc time like ``2ms``; ValueError naming the valid forms."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(s|ms|us)", str(text).strip().lower())
    if not m:
        raise ValueError(f"delay {text!r} is not valid; valid: a number with s, ms or us, e.g. 2ms")
    seconds = float(m.group(1)) * _DELAY_UNITS[m.group(2)]
    if not 0 < seconds <= 10:
        raise ValueError(f"delay {text!r} is out of range; valid: more than 0 and at most 10s")
    return seconds


def burst_bytes(rate: float, mtu: int) -> int:
    """The token bucket's size for ``rate`` bits/s: ``_BURST_S`` of traffic, at least 128 KiB and 2 MTUs."""
    return int(max(rate / 8 * _BURST_S, _MIN_BURST, 2 * mtu))


def qdisc_commands(dev: str, rate: float | None, delay: float | None, mtu: int) -> list[list[str]]:
    """tc commands (run inside the device's namespace) shaping ``dev``'s egress: tbf, then netem under it."""
    cmds = []
    if rate is not None:
        cmds.append(["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf", "rate", f"{int(rate)}bit",
                     "burst", str(burst_bytes(rate, mtu)), "latency", _LATENCY])
    if delay is not None:
        where = ["parent", "1:1"] if rate is not None else ["root"]
        cmds.append(["tc", "qdisc", "add", "dev", dev, *where, "handle", "10:", "netem",
                     "delay", f"{delay * 1e6:.0f}us"])
    return cmds


def netem_missing(netns: str) -> str | None:
    """None when the kernel has netem (tried on ``lo`` inside ``netns``), else tc's one-line reason."""
    add = subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                          "delay", "1ms"], capture_output=True, text=True)
    if add.returncode == 0:
        subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", "lo", "root"],
                       capture_output=True)
        return None
    return (add.stderr.strip().splitlines() or ["tc failed"])[-1]
