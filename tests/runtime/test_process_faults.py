"""runtime/faults.py's view of the other processes of a run: how a process that is gone is told
apart, named and described (the two-process runs are tests/scale/test_rank_failure.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from rlhfkit.errors import UserError, printed_here
from rlhfkit.runtime.faults import (
    PeerFailure,
    exit_cause,
    is_collective_failure,
    peer_states,
    process_identity,
)


def test_exit_status_in_words():
    assert exit_cause(signal.SIGKILL) == "SIGKILL"  # killed: the signal in the low 7 bits
    assert exit_cause(3 << 8) == "exit code 3"
    assert exit_cause(None) == ""


def _wait_zombie(pid: int) -> None:
    for _ in range(500):
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            return
        time.sleep(0.01)
    raise AssertionError("the child never became a zombie")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_process_killed_on_this_machine_is_named_with_its_signal():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        peers = [process_identity(), process_identity(child.pid), ("elsewhere", child.pid, 1)]
        assert peers[1][0] == socket.gethostname() and peers[1][2] > 0
        assert peer_states(peers, 0) == {}  # alive
        child.kill()
        _wait_zombie(child.pid)  # not collected yet, as a launcher polling every 0.1 s leaves it
        assert peer_states(peers, 0) == {1: "died (SIGKILL)"}  # rank 2 is on another machine: unseen
    finally:
        child.kill()
        child.wait()
    assert peer_states(peers, 0) == {1: "is gone"}  # collected: only its absence is known
    reused = [peers[0], (peers[0][0], os.getpid(), peers[0][2] + 1)]  # this pid, another start time
    assert peer_states(reused, 0) == {1: "is gone"}


def test_collective_failures_are_told_from_other_errors():
    import torch.distributed as dist

    gloo = RuntimeError("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:40880: Connection reset by peer.")
    assert is_collective_failure(gloo) and is_collective_failure(dist.DistBackendError("NCCL communicator aborted"))
    assert not is_collective_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_collective_failure(ValueError("Connection reset by peer"))  # not what a collective raises


def test_a_bad_input_is_printed_by_each_machine_s_first_process_only():
    assert printed_here(UserError("x"), {}) and printed_here(UserError("x"), {"LOCAL_RANK": "0"})
    assert not printed_here(UserError("x"), {"LOCAL_RANK": "1"})
    assert printed_here(PeerFailure("rank 0 is gone", printed=True), {"LOCAL_RANK": "1"})
    assert not printed_here(PeerFailure("rank 1 is gone", printed=False), {"LOCAL_RANK": "0"})
    assert PeerFailure("x").exit_code == 1
