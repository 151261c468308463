"""The child process that runs a target's inputs, one after the other: ``python -m tests.fuzz.worker
TARGET``. Reads ``<u4 length, bytes`` frames on stdin; answers each with ``<u1 verdict, <u4 length,
text`` on stdout (0: as promised; 1: a finding, with its traceback). A crash of this process (a
signal, an abort) is seen by the parent as the end of its stdout: a finding too."""

from __future__ import annotations

import os
import struct
import sys
import traceback


def main() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from tests.fuzz.targets import HIDDEN, TARGETS

    target = {**TARGETS, **HIDDEN}[sys.argv[1]][0]
    read, write = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = read.read(4)
        if len(head) < 4:
            return
        (n,) = struct.unpack("<I", head)
        data = read.read(n)
        try:
            target(data)
            verdict, text = 0, b""
        except BaseException:  # noqa: BLE001 - every other outcome is a finding
            verdict, text = 1, traceback.format_exc().encode()[-4000:]
        write.write(struct.pack("<BI", verdict, len(text)) + text)
        write.flush()


if __name__ == "__main__":
    main()
