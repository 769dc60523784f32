"""The load test's CPU meter counts the Chromium this run started and no one else's.

A CI run (two pytest workers) measured the browser's CPU during the load test as -32 s: the meter summed every
Chromium process on the machine, and the other worker's browser closed between its two readings. These tests
start busy processes named as Chromium names its own (the kernel's comm, set with prctl) below and beside this
process, and read the meter."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from posviz_tools.loadtest import _descendants, browser_cpu_seconds

# A child that names itself "chrome-test" (PR_SET_NAME = 15), prints "ready", and spins for `seconds` of CPU.
SPIN = """
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, b"chrome-test", 0, 0, 0)
print("ready", flush=True)
end = time.process_time() + float(sys.argv[1])
while time.process_time() < end:
    pass
open(sys.argv[3], "w").close()  # done spinning
time.sleep(float(sys.argv[2]))
"""


def _spin(seconds: float, linger: float, done, detached: bool = False) -> subprocess.Popen:
    if detached:  # started by a shell that exits at once, so the spinner's parent is no longer this process
        cmd = f"{sys.executable} -c '{SPIN}' {seconds} {linger} {done} > /dev/null 2>&1 & echo $!"
        shell = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True, start_new_session=True)
        return int(shell.stdout.split()[-1])
    process = subprocess.Popen([sys.executable, "-c", SPIN, str(seconds), str(linger), str(done)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


def _wait_for(*files, at_most_s: float = 60.0) -> None:
    deadline = time.monotonic() + at_most_s  # a loaded CI machine may take a while to give 0.6 s of CPU
    while not all(f.exists() for f in files):
        assert time.monotonic() < deadline, "the spinners did not finish"
        time.sleep(0.05)


def test_a_chromium_child_of_this_process_is_counted_and_a_strangers_is_not(tmp_path):
    stranger = _spin(0.6, 60.0, tmp_path / "stranger", detached=True)
    before = browser_cpu_seconds()
    own = _spin(0.6, 60.0, tmp_path / "own")
    try:
        assert own.pid in _descendants(os.getpid())
        assert stranger not in _descendants(os.getpid())
        _wait_for(tmp_path / "stranger", tmp_path / "own")  # both have spun their 0.6 s of CPU and sleep
        used = browser_cpu_seconds() - before
        # the own spinner's 0.6 s, not the stranger's as well (1.2 s)
        assert 0.45 <= used <= 0.9, used
    finally:
        own.kill()
        own.wait()
        os.kill(stranger, 9)


def test_a_stranger_chromium_that_exits_between_readings_cannot_make_the_reading_fall(tmp_path):
    stranger = _spin(0.5, 0.0, tmp_path / "stranger", detached=True)  # spins, then exits during the reading
    before = browser_cpu_seconds()
    _wait_for(tmp_path / "stranger")
    time.sleep(0.2)
    assert browser_cpu_seconds() - before >= 0.0
    try:
        os.kill(stranger, 9)
    except ProcessLookupError:
        pass
