"""Mutation fuzzing of l5dask's parsers of untrusted bytes, each input run in a worker subprocess.

    python -m tests.fuzz run --seconds 60            # all targets, the time shared (CI: a minute)
    python -m tests.fuzz run --seconds 3600 --targets blosc,csv    # a long run, on demand
    python -m tests.fuzz replay                      # every input of the corpus (the tests do this)

Targets (``tests/fuzz/targets.py``): the compiled blosc gather against numcodecs, the partial
chunk reader (``read_chunk_rows``) and the compressed gather from the blocks it reads against the
whole chunk decoded, the compiled reads of a chunk in part against the Python path's, ``.zarray``
(1-D and N-D) and ``.zattrs`` parsing, L5Kit's CSV reader against ``float()``, and perception
tables with the compiled JSON type scan against ``json``, the cache's entries
(``l5dask.core.cache``: read back bit for bit, or refused in one line), and a dataset in a zip or
a tar (opened and read, or refused in one line). Inputs start from each target's seeds
and the corpus (``tests/fuzz/corpus/TARGET/``: inputs that once broke l5dask), then are mutated:
bit flips, interesting bytes and 32-bit integers (at blosc's header fields most of all),
insertions, deletions, truncation, splices, and JSON-aware edits (numbers made huge, negative or
booleans, strings made lists, values nested thousands deep).

A worker process runs the inputs of one target one after the other; an input that kills it (a
signal: SIGSEGV, SIGFPE...), hangs it past ``--timeout`` or makes the target fail (an exception
l5dask does not promise, a disagreement with the reference) is a finding: written to
``tests/fuzz/findings/TARGET/`` with what happened, and the worker is started again. Exit 1 when
there are findings. Add a finding, once fixed, to the corpus: the tests replay it for ever.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import selectors
import struct
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = HERE / "corpus"
FINDINGS = HERE / "findings"
INTERESTING8 = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x10, 0x20, 0x21]
#: targets whose inputs are a byte then a blosc chunk (mutated at its header's fields, never as JSON)
BLOSC_TARGETS = ("blosc", "chunk_rows", "chunk_read_part")
INTERESTING32 = [0, 1, -1, 2, 16, 17, 116, 127, 128, 255, 256, 4096, 65535, 65536, 2**31 - 1, -(2**31), 2**24]


class Worker:
    """One target's worker subprocess."""

    def __init__(self, target: str) -> None:
        self.target = target
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.worker", target],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def _read(self, n: int, deadline: float) -> bytes | None:
        out = b""
        fd = self.proc.stdout.fileno()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                return None
            chunk = os.read(fd, n - len(out))
            if not chunk:
                return b""
            out += chunk
        return out

    def run(self, data: bytes, timeout: float) -> tuple[str, str]:
        """``("ok" | "finding" | "crash" | "hang", details)``."""
        try:
            self.proc.stdin.write(struct.pack("<I", len(data)) + data)
            self.proc.stdin.flush()
        except BrokenPipeError:
            return "crash", self._died()
        deadline = time.monotonic() + timeout
        head = self._read(5, deadline)
        if head is None:
            self.close()
            return "hang", f"no answer within {timeout} s"
        if len(head) < 5:
            return "crash", self._died()
        verdict, n = struct.unpack("<BI", head)
        text = self._read(n, deadline) if n else b""
        if text is None or (n and len(text) < n):
            return "crash", self._died()
        return ("ok" if verdict == 0 else "finding"), text.decode(errors="replace")

    def _died(self) -> str:
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        err = self.proc.stderr.read().decode(errors="replace")[-2000:]
        return f"the worker died (exit {code}){': ' + err if err else ''}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass


# --- mutations --------------------------------------------------------------------------------------------
def _json_edit(data: bytes, rng: random.Random) -> bytes:
    text = data.decode("utf-8", "replace")
    numbers = [m.span() for m in re.finditer(r"-?\d+(\.\d+)?([eE][-+]?\d+)?", text)]
    strings = [m.span() for m in re.finditer(r'"[^"\\]*"', text)]
    choice = rng.randrange(5)
    if choice == 0 and numbers:
        a, b = rng.choice(numbers)
        new = rng.choice(["1" + "0" * 30, "-1", "0", str(2**63), "true", "1e400", "-0.0", "1.5", '"5"', "null"])
        return (text[:a] + new + text[b:]).encode()
    if choice == 1 and strings:
        a, b = rng.choice(strings)
        new = rng.choice([f"[{text[a:b]}]", "5", "{}", "null", text[a:b] * 2, '"\\u0000"', "true"])
        return (text[:a] + new + text[b:]).encode()
    if choice == 2:
        at = rng.randrange(len(text) + 1)
        depth = rng.choice([10, 100, 3000, 100000])
        return (text[:at] + "[" * depth + "]" * depth + text[at:]).encode()
    if choice == 3 and strings:
        a, b = rng.choice(strings)
        return (text[:b] + ", " + text[a:b] + text[b:]).encode()
    orders = [m.start() + 1 for m in re.finditer(r'"[<>|=][a-zA-Z]', text)]
    if choice == 4 and orders:  # a dtype's byte order (big-endian fields were accepted, then failed)
        at = rng.choice(orders)
        return (text[:at] + rng.choice("<>|=") + text[at + 1 :]).encode()
    return data


def mutate(data: bytes, pool: list[bytes], target: str, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice([1, 1, 1, 2, 3, 5])):
        choice = rng.randrange(9)
        if target not in BLOSC_TARGETS and choice < 3:
            buf = bytearray(_json_edit(bytes(buf), rng))
            continue
        if not buf:
            buf += bytes([rng.randrange(256)])
            continue
        i = rng.randrange(len(buf))
        if choice == 0:
            buf[i] ^= 1 << rng.randrange(8)
        elif choice == 1:
            buf[i] = rng.choice(INTERESTING8)
        elif choice == 2 or choice == 3:  # an int32 at a header field (blosc: bytes 4, 8, 12 past the config byte)
            at = rng.choice([1, 5, 9, 13, 17, 21]) if target in BLOSC_TARGETS and rng.random() < 0.7 else i
            if target in BLOSC_TARGETS and rng.random() < 0.3:
                at = rng.choice([1, 2, 3, 4])
                if at < len(buf):
                    buf[at] = rng.choice(INTERESTING8 + [rng.randrange(256)])
                continue
            if at + 4 <= len(buf):
                buf[at : at + 4] = struct.pack("<i", rng.choice(INTERESTING32))
        elif choice == 4:
            del buf[i : i + rng.choice([1, 2, 4, 16, 100])]
        elif choice == 5:
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.choice([1, 2, 4, 16])))
        elif choice == 6:
            del buf[rng.randrange(len(buf) + 1) :]
        elif choice == 7 and pool:
            other = rng.choice(pool)
            j = rng.randrange(len(other) + 1)
            buf = buf[:i] + bytearray(other[j:])
        else:
            buf[i : i + 8] = bytes(rng.randrange(256) for _ in range(8))
    return bytes(buf)


# --- runs ----------------------------------------------------------------------------------------------------
def corpus(target: str) -> list[tuple[str, bytes]]:
    folder = CORPUS / target
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()] if folder.is_dir() else []


def _save(target: str, data: bytes, kind: str, details: str) -> Path:
    folder = FINDINGS / target
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{hashlib.sha1(data).hexdigest()[:16]}"
    path.write_bytes(data)
    path.with_suffix(".txt").write_text(details)
    return path


def replay(targets: list[str], timeout: float) -> int:
    bad = 0
    for target in targets:
        worker = Worker(target)
        for name, data in corpus(target):
            kind, details = worker.run(data, timeout)
            if kind != "ok":
                bad += 1
                print(f"{target}/{name}: {kind}: {details.strip().splitlines()[-1] if details.strip() else ''}")
                worker.close()
                worker = Worker(target)
        worker.close()
        print(f"{target}: {len(corpus(target))} corpus inputs replayed")
    return 1 if bad else 0


def run(targets: list[str], seconds: float, seed: int, timeout: float) -> int:
    from tests.fuzz.targets import TARGETS

    rng = random.Random(seed)
    findings = 0
    share = seconds / len(targets)
    for target in targets:
        pool = [d for _, d in corpus(target)] + TARGETS[target][1]()
        worker = Worker(target)
        done, start = 0, time.monotonic()
        inputs = list(pool)
        while time.monotonic() - start < share:
            data = inputs.pop() if inputs else mutate(rng.choice(pool), pool, target, rng)
            kind, details = worker.run(data, timeout)
            done += 1
            if kind != "ok":
                findings += 1
                path = _save(target, data, kind, details)
                print(f"{target}: {kind}: {path} ({details.strip().splitlines()[-1] if details.strip() else ''})")
                worker.close()
                worker = Worker(target)
            elif rng.random() < 0.05 and len(pool) < 2000:
                pool.append(data)  # keep some accepted mutants as parents
        worker.close()
        print(f"{target}: {done} inputs in {time.monotonic() - start:.0f} s, {findings} finding(s) so far")
    return 1 if findings else 0


def main(argv: list[str] | None = None) -> int:
    from tests.fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["run", "replay"])
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated (default: all)")
    parser.add_argument("--seconds", type=float, default=60.0, help="time of a run, shared by the targets")
    parser.add_argument("--seed", type=int, default=int(time.time()), help="the mutations' random seed")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds an input may take")
    args = parser.parse_args(argv)
    targets = [t for t in args.targets.split(",") if t]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; they are {', '.join(TARGETS)}")
    if args.command == "replay":
        return replay(targets, args.timeout)
    print(f"fuzzing {', '.join(targets)} for {args.seconds:.0f} s (seed {args.seed})")
    return run(targets, args.seconds, args.seed, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
