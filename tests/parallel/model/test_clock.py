"""ClockedGroup: a group's blocking calls timed and counted, everything else passed through."""

import time

import numpy as np

from npddp.parallel.model.clock import ClockedGroup


class SlowGroup:
    """A stand-in group whose calls take 10 ms each and return their buffer."""

    name, size, rank = "slow", 2, 0

    def __init__(self):
        self.seen = []

    def _call(self, what, buf, *args, **kwargs):
        time.sleep(0.01)
        self.seen.append((what, args, kwargs))
        return buf

    def allreduce(self, buf, op="sum"):
        return self._call("allreduce", buf, op=op)

    def send(self, buf, dest, tag=0):
        return self._call("send", buf, dest, tag=tag)

    def recv(self, buf, source, tag=0):
        return self._call("recv", buf, source, tag=tag)

    def broadcast(self, buf, root=0):
        return self._call("broadcast", buf, root=root)


def test_blocking_calls_add_their_time_calls_and_bytes():
    group = SlowGroup()
    clocked = ClockedGroup(group)
    buf = np.zeros(16)
    assert clocked.allreduce(buf, op="avg") is buf
    clocked.send(buf, 1, 3)
    clocked.recv(buf, 1, tag=4)
    clocked.broadcast(buf, root=1)
    assert group.seen == [("allreduce", (), {"op": "avg"}), ("send", (1,), {"tag": 3}), ("recv", (1,), {"tag": 4}),
                          ("broadcast", (), {"root": 1})]
    assert clocked.calls == 4 and clocked.nbytes == 4 * buf.nbytes
    assert 0.04 <= clocked.seconds < 1.0
    assert (clocked.name, clocked.size, clocked.rank) == ("slow", 2, 0)     # passed through
    clocked.reset()
    assert (clocked.seconds, clocked.calls, clocked.nbytes) == (0.0, 0, 0)


def test_a_failing_call_still_counts_its_time():
    class Broken(SlowGroup):
        def recv(self, buf, source, tag=0):
            time.sleep(0.01)
            raise ConnectionError("peer gone")

    clocked = ClockedGroup(Broken())
    try:
        clocked.recv(np.zeros(2), 1)
    except ConnectionError:
        pass
    assert clocked.calls == 1 and clocked.seconds >= 0.01
