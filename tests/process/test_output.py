"""The launcher's output forwarding: whole lines under one lock, tags, a prompt shown after a short wait, a closed reader."""

import io
import os
import threading
import time

from npddp.process import output


class Recorder(io.BytesIO):
    """An output stream that keeps every write separately."""

    def __init__(self):
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data):
        self.writes.append(bytes(data))
        return len(data)


def test_pieces_of_lines_go_out_as_whole_lines_with_their_tag():
    read_end, write_end = os.pipe()
    out = Recorder()
    thread = output.start(read_end, output.Output(out, threading.Lock()), b"[1] ")
    for piece in (b"OK rank", b" 1 iters", b" 12\nsecond", b" line\nthird\n"):
        os.write(write_end, piece)
        time.sleep(0.01)
    os.close(write_end)
    thread.join(10)
    text = b"".join(out.writes)
    assert text == b"[1] OK rank 1 iters 12\n[1] second line\n[1] third\n"
    assert all(w.endswith(b"\n") for w in out.writes), out.writes


def test_a_prompt_without_a_newline_appears_after_a_short_wait_and_its_line_is_tagged_once():
    read_end, write_end = os.pipe()
    out = Recorder()
    thread = output.start(read_end, output.Output(out, threading.Lock()), b"[0] ")
    os.write(write_end, b"password: ")
    deadline = time.monotonic() + output.PARTIAL_AFTER_S + 10
    while not out.writes and time.monotonic() < deadline:
        time.sleep(0.02)
    assert out.writes == [b"[0] password: "]
    os.write(write_end, b"ok\nlast without newline")
    os.close(write_end)
    thread.join(10)
    assert b"".join(out.writes) == b"[0] password: ok\n[0] last without newline"


def test_after_the_reader_goes_away_the_rest_is_read_and_dropped(tmp_path):
    read_end, write_end = os.pipe()
    sink_read, sink_write = os.pipe()
    os.close(sink_read)                                   # like `| head` that has exited
    stream = os.fdopen(sink_write, "wb")
    out = output.Output(stream, threading.Lock())
    thread = output.start(read_end, out)
    payload = b"x" * 1000 + b"\n"
    for _ in range(300):                                  # far more than a pipe holds: never blocks the writer
        os.write(write_end, payload)
    os.close(write_end)
    thread.join(10)
    assert not thread.is_alive() and out.closed
    stream.close()                                        # no BrokenPipeError at the flush either
