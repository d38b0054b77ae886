"""Run an untrusted program and its tests in a process of its own, with limits that always apply.

`Sandbox(limits, isolation).run(job)` -> `Execution`. Each execution gets:
- a fresh temporary folder as working directory, removed afterwards; a scrubbed environment
  (PATH, HOME = that folder, LANG); stdin from /dev/null; no inherited file descriptors but the
  harness's job and results files; stdout/stderr in files capped by the file-size limit, of which
  the first `Limits.max_output` characters are kept;
- resource limits set by the trusted harness (rewards/code_harness.py) before the program runs:
  CPU seconds, address space, file size, open files, processes; as root it first becomes a uid of
  its own (so the process limit counts only its processes, it cannot read 0700 folders such as
  /root, and every process left with that uid is killed afterwards);
- a wall-clock timeout that kills the whole process group (start_new_session);
- with isolation "bwrap" (Debian's bubblewrap), also: a read-only system, a private /tmp, no network,
  its own pid namespace (it sees and can signal only its own processes; all die with it), the home
  folders hidden.

Isolation "auto" uses bubblewrap where a trivial command runs under it, else resource limits only;
`Sandbox.note` is the one line that says which a run got. docs/rewards.md lists what each level stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlhfkit.core.choices import CODE_ISOLATIONS
from rlhfkit.errors import UserError

ISOLATIONS = CODE_ISOLATIONS
INSIDE = "/tmp/sandbox"  # the execution's folder as bubblewrap shows it
HARNESS = Path(__file__).with_name("code_harness.py")
SIGNALS = {int(s) for s in signal.Signals}
UID_BASE = 1 << 20  # root only: executions run as UID_BASE + a random offset (no real user has these)


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 5  # CPU seconds of the program (SIGXCPU past it)
    wall_s: float = 20.0  # wall-clock seconds before the process group is killed
    memory_mb: int = 1024  # address space (the interpreter itself takes ~30 MB)
    file_mb: int = 8  # largest file it may write, stdout and stderr included
    open_files: int = 64
    processes: int = 16  # processes of its uid (only enforced for a non-root uid)
    max_output: int = 2000  # characters of stdout/stderr kept (and of each stdin/stdout answer compared)


@dataclass
class Execution:
    """One run of a program against its tests. statuses[i]: pass | fail | error | memory | timeout |
    out (stdin/stdout: `outputs[i]` holds the answer to compare)."""

    statuses: list[str]
    details: list[str]
    outputs: dict[int, str] = field(default_factory=dict)
    stdout: str = ""
    stderr: str = ""
    returncode: int | None = None
    wall_s: float = 0.0


class Sandbox:
    def __init__(self, limits: Limits = Limits(), isolation: str = "auto"):
        if isolation not in ISOLATIONS:
            raise UserError(f"code_isolation ({isolation!r}) must be one of: {', '.join(ISOLATIONS)}")
        self.limits = limits
        self.python, self.own_uid = interpreter()
        self.harness = HARNESS.read_text(encoding="utf-8")
        self.isolation, why = self._choose(isolation)
        self.note = describe(self.isolation, why) + ("" if self.own_uid or os.getuid() != 0 else
                                                     "; as root (no Python every user can reach)")

    def _choose(self, wanted: str) -> tuple[str, str]:
        if wanted == "rlimits":
            return "rlimits", "asked for"
        ok, why = bwrap_works(self.python)
        if ok:
            return "bwrap", ""
        if wanted == "bwrap":
            raise UserError(f"code_isolation=bwrap: bubblewrap cannot run here ({why}); install it "
                            "(apt-get install bubblewrap) or use code_isolation=auto")
        return "rlimits", why

    def argv(self, folder: str) -> list[str]:
        harness = f"{INSIDE if self.isolation == 'bwrap' else folder}/harness.py"
        cmd = [self.python, "-I", "-S", harness]
        return (bwrap_prefix(folder, self.python) + cmd) if self.isolation == "bwrap" else cmd

    def run(self, job: dict) -> Execution:
        """Run `job` (code_harness's format, without nonces and limits) and collect each test's result."""
        n = len(job["tests"] if job["kind"] == "asserts" else job["inputs"])
        nonces = [secrets.token_hex(16) for _ in range(n)]
        uid = UID_BASE + secrets.randbelow(1 << 16) if self.own_uid else None
        full = {**job, "nonces": nonces, "uid": uid, "limits": asdict(self.limits),
                "max_output": self.limits.max_output}
        folder = tempfile.mkdtemp(prefix="rlhfkit-code-")
        try:
            with contextlib.ExitStack() as files:
                return self._execute(folder, full, uid, files)
        finally:
            if uid is not None:
                kill_uid(uid)
            shutil.rmtree(folder, ignore_errors=True)

    def _execute(self, folder: str, job: dict, uid: int | None, files: contextlib.ExitStack) -> Execution:
        (Path(folder) / "harness.py").write_text(self.harness, encoding="utf-8")
        job_fd = unlinked(folder, "job", json.dumps(job).encode(), files)
        res_fd = unlinked(folder, "results", b"", files, write=True)
        out_fd, err_fd = (unlinked(folder, name, b"", files, write=True) for name in ("stdout", "stderr"))
        if uid is not None:
            os.chown(folder, uid, uid)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": INSIDE if self.isolation == "bwrap" else folder,
               "LANG": "C.UTF-8", "TMPDIR": INSIDE if self.isolation == "bwrap" else folder}
        t0 = time.perf_counter()
        proc = subprocess.Popen([*self.argv(folder), str(job_fd[1]), str(res_fd[1])], cwd=folder, env=env,
                                stdin=subprocess.DEVNULL, stdout=out_fd[1], stderr=err_fd[1], close_fds=True,
                                pass_fds=(job_fd[1], res_fd[1]), start_new_session=True)
        for _, fd in (job_fd, res_fd, out_fd, err_fd):
            os.close(fd)  # the child holds its own copies
        timed_out = wait_or_kill(proc, self.limits.wall_s)
        wall = time.perf_counter() - t0
        results = read_all(res_fd[0], 1 << 22).decode("utf-8", "replace")
        return collect(job["nonces"], results, proc.returncode, timed_out, wall,
                       read_all(out_fd[0], self.limits.max_output).decode("utf-8", "replace"),
                       read_all(err_fd[0], self.limits.max_output).decode("utf-8", "replace"))


def interpreter() -> tuple[str, bool]:
    """(the Python programs run under, whether each execution gets a uid of its own). Not root: this
    Python's base interpreter, as this user. Root: the first of that, /usr/bin/python3 and
    /usr/local/bin/python3 whose binary and standard library every user may reach (programs run as
    another uid); else this one, as root."""
    own = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    if os.getuid() != 0:
        return own, False
    for exe, prefix in ((own, sys.base_prefix), ("/usr/bin/python3", "/usr"), ("/usr/local/bin/python3", "/usr/local")):
        exe = os.path.realpath(exe)
        if os.path.isfile(exe) and reachable(exe) and reachable(os.path.join(os.path.realpath(prefix), "lib")):
            return exe, True
    return own, False


def reachable(path: str) -> bool:
    """Every user may reach `path`: each folder on the way is world-searchable, the end world-readable."""
    parts = Path(path).parts
    try:
        folders = [os.stat(os.path.join(*parts[:i])).st_mode for i in range(1, len(parts))]
        end = os.stat(path).st_mode
    except OSError:
        return False
    return all(m & 0o001 for m in folders) and bool(end & 0o004)


def unlinked(folder: str, name: str, data: bytes, files: contextlib.ExitStack,
             write: bool = False) -> tuple[int, int]:
    """(our read fd, the child's fd) of a file that no longer has a name: the program cannot open it
    by path. The child's fd is read-only for the job, write-only for results and output."""
    path = os.path.join(folder, "." + name)
    with open(path, "wb") as f:
        f.write(data)
    ours = os.open(path, os.O_RDONLY)
    theirs = os.open(path, (os.O_WRONLY | os.O_APPEND) if write else os.O_RDONLY)
    os.unlink(path)
    files.callback(os.close, ours)
    return ours, theirs


def read_all(fd: int, limit: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, limit)


def wait_or_kill(proc: subprocess.Popen, wall_s: float) -> bool:
    """Wait for `proc`; past `wall_s` kill its process group. True if it was killed for time.
    The group is killed in any case: no process the program left behind survives it."""
    timed_out = False
    try:
        proc.wait(timeout=wall_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return timed_out


def kill_uid(uid: int) -> None:
    """Kill every process of `uid` (an execution's own uid, root only), twice: a fork bomb may be
    creating one while the first sweep runs."""
    for _ in range(2):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if entry.stat().st_uid == uid:
                        os.kill(int(entry.name), signal.SIGKILL)


def collect(nonces: list[str], results: str, returncode: int, timed_out: bool, wall: float,
            stdout: str, stderr: str) -> Execution:
    """Each test's (status, detail) from the first results line that carries its nonce; a test with
    no such line gets the reason the process ended."""
    found: dict[int, tuple[str, str]] = {}
    for line in results.splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[1].isdigit():
            i = int(parts[1])
            if i < len(nonces) and i not in found and secrets.compare_digest(parts[0], nonces[i]):
                found[i] = (parts[2], parts[3] if len(parts) > 3 else "")
    missing = ended(returncode, timed_out)
    statuses, details, outputs = [], [], {}
    for i in range(len(nonces)):
        status, detail = found.get(i, missing)
        if status == "out":
            outputs[i] = json.loads(detail) if detail else ""
        statuses.append(status)
        details.append(detail if status != "out" else "")
    return Execution(statuses, details, outputs, stdout, stderr, returncode, wall)


def ended(returncode: int, timed_out: bool) -> tuple[str, str]:
    """The status of a test that never reported, from how the process ended."""
    if timed_out:
        return "timeout", "killed at the wall-clock limit"
    if returncode is not None and (returncode < 0 or returncode > 128):  # the harness's 128 + signal
        sig = -returncode if returncode < 0 else returncode - 128
        if sig == signal.SIGXCPU:
            return "timeout", "CPU-time limit"
        return "error", f"killed by signal {signal.Signals(sig).name if sig in SIGNALS else sig}"
    return "error", f"exited with code {returncode} before the test reported"


def bwrap_prefix(folder: str, python: str) -> list[str]:
    """bubblewrap's command line: a read-only view of the system, a private /tmp with the execution's
    folder at INSIDE, /dev and /proc of its own, no network, its own pid/ipc/uts namespaces, a new
    session (no terminal injection), home folders hidden (the interpreter's prefix shown again when it
    lies under one), killed with its parent. As non-root also a user namespace."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--bind", folder, INSIDE, "--chdir", INSIDE, "--unshare-net", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--die-with-parent", "--new-session"]
    if os.getuid() != 0:
        argv.append("--unshare-user")
    hidden = [d for d in ("/root", "/home", os.path.expanduser("~")) if os.path.isdir(d)]
    hidden = [d for i, d in enumerate(hidden) if d not in hidden[:i] and not d.startswith("/tmp")]
    for d in hidden:
        argv += ["--tmpfs", d]
    prefix = os.path.realpath(sys.base_prefix)
    if any(prefix == d or prefix.startswith(d.rstrip("/") + "/") for d in [*hidden, "/tmp"]):
        argv += ["--ro-bind", prefix, prefix]
    python_dir = os.path.dirname(os.path.realpath(python))
    if not python_dir.startswith(prefix) and any(python_dir.startswith(d + "/") for d in hidden):
        argv += ["--ro-bind", python_dir, python_dir]
    return argv


def bwrap_works(python: str) -> tuple[bool, str]:
    """(True, "") when a trivial program runs under bubblewrap here, else (False, why)."""
    if shutil.which("bwrap") is None:
        return False, "bubblewrap (bwrap) not found"
    folder = tempfile.mkdtemp(prefix="rlhfkit-code-")
    try:
        done = subprocess.run([*bwrap_prefix(folder, python), python, "-I", "-S", "-c", "pass"],
                              capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bwrap failed: {type(e).__name__}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if done.returncode != 0:
        lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return False, f"bwrap failed: {lines[-1] if lines else f'exit code {done.returncode}'}"
    return True, ""


def describe(isolation: str, why: str) -> str:
    """The one line a run prints about the isolation its programs get."""
    if isolation == "bwrap":
        return ("[code] sandbox: bubblewrap (read-only system, private /tmp, no network, own pid namespace, "
                "home hidden) + resource limits")
    return f"[code] sandbox: resource limits only ({why}; no network or filesystem isolation: docs/rewards.md)"
