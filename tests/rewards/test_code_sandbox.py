"""Hostile programs against reward=code's sandbox, as real processes, under each isolation level.

Each program scores 0 (or is contained) with its reason, this test process survives, and nothing
outside the sandbox changes: a sentinel file in a temporary HOME, the repository's git status,
no process or temporary folder of the sandbox left behind. Small CPU limits, generous wall limits
(the machine may be loaded): a wall timeout is only the expected outcome of the fork bomb.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from rlhfkit.rewards.code import CodeReward, CodeSettings
from rlhfkit.rewards.sandbox import Limits, Sandbox, bwrap_works

REPO = Path(__file__).resolve().parents[2]
ROOT = os.getuid() == 0
TESTS = ["assert f(1) == 2", "assert f(2) == 3"]
LEVELS = ["rlimits", pytest.param("bwrap", marks=pytest.mark.skipif(
    not bwrap_works(os.path.realpath(os.sys.executable))[0], reason="bubblewrap does not run here"))]


def sandbox_processes(marker: str) -> set[int]:
    """Processes whose command line names `marker` (this test's sandbox folders: the harness under
    resource limits, bubblewrap itself, whose pid namespace takes every process inside with it)."""
    found = set()
    for cmd in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if marker.encode() in Path(cmd).read_bytes():
                found.add(int(cmd.split("/")[2]))
        except OSError:
            pass
    return found


def git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A temporary HOME with a sentinel, and this test's own parent folder for sandbox folders (so
    tests running side by side do not see each other's); after the test, checks that nothing
    outside changed."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "secret.txt").write_text("sentinel-secret")
    monkeypatch.setenv("HOME", str(home))
    folders = Path(tempfile.mkdtemp(prefix="rlhfkit-sandbox-test-", dir="/tmp"))
    folders.chmod(0o711)  # an execution's own uid must reach its folder inside
    monkeypatch.setattr(tempfile, "tempdir", str(folders))
    before = git_status()
    yield home
    try:
        assert (home / "secret.txt").read_text() == "sentinel-secret"
        assert sorted(p.name for p in home.iterdir()) == ["secret.txt"]
        assert git_status() == before
        for _ in range(100):  # bubblewrap's pid namespace dies with it, a moment later on a loaded machine
            if not sandbox_processes(str(folders)):
                break
            time.sleep(0.1)
        assert not sandbox_processes(str(folders)), "a sandboxed process outlived its execution"
        assert not list(folders.iterdir()), "a sandbox folder was left behind"
    finally:
        shutil.rmtree(folders, ignore_errors=True)


def reward(isolation: str, **limits) -> CodeReward:
    sandbox = Sandbox(Limits(**{"cpu_s": 1, "wall_s": 60.0, "memory_mb": 512, **limits}), isolation)
    return CodeReward(CodeSettings(code_workers=2, code_isolation=isolation), sandbox)


def score(rew: CodeReward, program: str, tests=TESTS) -> tuple[float, str]:
    scores, metrics = rew.score_with_metrics(["p"], [f"```python\n{program}\n```"], test_list=[tests])
    reason = [k for k, v in metrics.items() if v[0] == 1.0]
    return scores[0], (reason[0] if reason else "fail")


@pytest.mark.parametrize("isolation", LEVELS)
def test_a_correct_program_passes_and_a_wrong_one_fails(isolation, world):
    rew = reward(isolation)
    assert score(rew, "def f(x):\n    return x + 1") == (1.0, "code_pass_rate")
    assert score(rew, "def f(x):\n    return x") == (0.0, "fail")
    assert score(rew, "def f(x):\n    return 2 if x == 1 else 0") == (0.5, "fail")


@pytest.mark.parametrize("isolation", LEVELS)
def test_endless_loop_is_stopped_by_the_cpu_limit(isolation, world):
    assert score(reward(isolation), "while True:\n    pass") == (0.0, "code_timeout_rate")


@pytest.mark.parametrize("isolation", LEVELS)
def test_sleeping_forever_is_stopped_by_the_wall_clock(isolation, world):
    rew = reward(isolation, wall_s=3.0)
    assert score(rew, "import time\ntime.sleep(1000)") == (0.0, "code_timeout_rate")


@pytest.mark.parametrize("isolation", LEVELS)
def test_fork_bomb_is_contained_and_leaves_no_process(isolation, world):
    program = ("import os\nfor _ in range(10000):\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
               "import time\ntime.sleep(1000)")
    s, why = score(reward(isolation, wall_s=5.0), program)
    assert s == 0.0 and why in ("code_timeout_rate", "code_error_rate")


@pytest.mark.parametrize("isolation", LEVELS)
def test_memory_hog_gets_memory_error(isolation, world):
    program = "blocks = []\nwhile True:\n    blocks.append(bytearray(200 * 1024 * 1024))"
    assert score(reward(isolation, cpu_s=3), program) == (0.0, "code_memory_rate")


@pytest.mark.parametrize("isolation", LEVELS)
def test_hundred_megabytes_of_output_are_cut(isolation, world):
    program = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1024 * 1024)\ndef f(x):\n    return x + 1"
    rew = reward(isolation)
    job = {"kind": "asserts", "solution": program, "setup": "", "tests": TESTS}
    ex = rew.sandbox.run(job)
    assert ex.statuses == ["error", "error"] and "File too large" in ex.details[0]
    assert len(ex.stdout) <= rew.sandbox.limits.max_output


@pytest.mark.parametrize("isolation", LEVELS)
def test_writing_outside_its_folder_fails(isolation, world):
    targets = [world / "planted.txt", REPO / "planted.txt"] + ([Path("/tmp/rlhfkit-planted.txt")]
                                                               if isolation == "bwrap" else [])
    if not ROOT and isolation == "rlimits":
        pytest.skip("resource limits alone do not stop a program writing where its user may (docs/rewards.md)")
    program = (f"wrote = 0\nfor p in {[str(t) for t in targets]!r}:\n    try:\n        open(p, 'w').write('x')\n"
               "        wrote += 1\n    except OSError:\n        pass\ndef f(x):\n    return x + 1 if wrote else 0")
    assert score(reward(isolation), program) == (0.0, "fail")
    assert not any(t.exists() for t in targets)


@pytest.mark.parametrize("isolation", LEVELS)
def test_reading_the_users_home_fails(isolation, world):
    if not ROOT and isolation == "rlimits":
        pytest.skip("resource limits alone do not stop a program reading what its user may (docs/rewards.md)")
    program = (f"try:\n    secret = open({str(world / 'secret.txt')!r}).read()\nexcept OSError:\n    secret = ''\n"
               "print(secret)\ndef f(x):\n    return x + 1 if secret else 0")
    rew = reward(isolation)
    assert score(rew, program) == (0.0, "fail")
    ex = rew.sandbox.run({"kind": "asserts", "solution": program, "setup": "", "tests": TESTS})
    assert "sentinel-secret" not in ex.stdout


@pytest.mark.parametrize("isolation", ["bwrap"])
def test_no_network_under_bubblewrap(isolation, world):
    if not bwrap_works(os.path.realpath(os.sys.executable))[0]:
        pytest.skip("bubblewrap does not run here")
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(20)
    port = server.getsockname()[1]
    accepted = []
    thread = threading.Thread(target=lambda: _accept_once(server, accepted), daemon=True)
    thread.start()
    program = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'hi')\n"
               "    reached = True\nexcept OSError:\n    reached = False\ndef f(x):\n    return x + 1 if reached else 0")
    try:
        assert score(reward(isolation), program) == (0.0, "fail")
    finally:
        server.close()
        thread.join(timeout=30)
    assert not accepted


def _accept_once(server, accepted):
    try:
        conn, _ = server.accept()
        accepted.append(conn)
        conn.close()
    except OSError:  # closed or timed out: nobody came
        pass


@pytest.mark.parametrize("isolation", LEVELS)
def test_killing_its_parent_or_this_process_harms_nothing(isolation, world):
    if not ROOT and isolation == "rlimits":
        pytest.skip("as a non-root user without bubblewrap a program may signal its user's processes (docs)")
    program = (f"import os, signal\nfor pid in (os.getppid(), {os.getpid()}, {os.getppid()}):\n    try:\n"
               "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\ndef f(x):\n    return 0")
    rew = reward(isolation)
    # the harness's parent dies: the tests fail, or are unreported when the group is killed first
    assert score(rew, program)[0] == 0.0
    assert score(rew, "def f(x):\n    return x + 1") == (1.0, "code_pass_rate")  # and scoring goes on


@pytest.mark.parametrize("isolation", LEVELS)
@pytest.mark.parametrize("program", [
    "import sys\nsys.exit(0)\ndef f(x):\n    return x + 1",
    "import os\nos._exit(0)",
    "raise SystemExit(0)",
    "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\nbuiltins.exec = lambda *a, **k: None\n"
    "builtins.compile = lambda *a, **k: None\nbuiltins.enumerate = lambda xs: [(0, 'pass'), (1, 'pass')]\n"
    "builtins.isinstance = lambda *a: True\nlen = lambda x: 0\ndef f(x):\n    return 0",
    "import sys, os\nprint('0 pass\\n1 pass')\nfor fd in range(3, 64):\n    try:\n"
    "        os.write(fd, b'x 0 pass \\nx 1 pass \\n')\n    except OSError:\n        pass\nos._exit(0)",
], ids=["sys-exit", "os-exit", "raise-systemexit", "patch-builtins", "forge-lines"])
def test_faking_a_pass_scores_zero(isolation, program, world):
    s, why = score(reward(isolation), program)
    assert s == 0.0 and why in ("code_error_rate", "fail")


@pytest.mark.parametrize("isolation", LEVELS)
def test_reading_an_earlier_result_back_does_not_forge_the_next(isolation, world):
    program = (
        "def f(x):\n    import os, glob\n    for p in glob.glob('/proc/self/fd/*'):\n        try:\n"
        "            lines = open(p).read().splitlines()\n        except Exception:\n            continue\n"
        "        for line in lines:\n            nonce = line.split(' ')[0]\n            for fd in range(3, 64):\n"
        "                for i in range(3):\n                    try:\n"
        "                        os.write(fd, f'{nonce} {i} pass x\\n'.encode())\n"
        "                    except OSError:\n                        pass\n    os._exit(0)")
    s, why = score(reward(isolation), program, ["assert True", "assert f(1) == 2", "assert f(2) == 3"])
    assert s == pytest.approx(1 / 3) and why == "code_error_rate"


@pytest.mark.parametrize("isolation", LEVELS)
@pytest.mark.parametrize("leave_group", [False, True], ids=["same-group", "setsid"])
def test_a_process_left_behind_is_killed_when_the_execution_ends(isolation, leave_group, world):
    if leave_group and not ROOT and isolation == "rlimits":
        pytest.skip("as a non-root user without bubblewrap a process that leaves the group survives (docs)")
    program = (f"import os, time\nif os.fork() == 0:\n    if {leave_group}:\n        os.setsid()\n"
               "    time.sleep(1000)\n    os._exit(0)\ndef f(x):\n    return x + 1")
    assert score(reward(isolation), program) == (1.0, "code_pass_rate")  # the world fixture checks the rest
