"""The trusted start of one sandboxed execution (run as ``python -I -S code_harness.py``; stdlib only,
imports nothing of rlhfkit: rewards/sandbox.py copies this file into the execution's folder).

Usage: ``code_harness.py JOB_FD RESULTS_FD``. It reads its job from JOB_FD (an unlinked file: the
tests and one random nonce per test) and closes it, drops root to the job's uid, sets the resource
limits (hard = soft but for CPU, so the program cannot raise them), then runs the untrusted program and its
tests. Each test's result is written by this harness to RESULTS_FD as ``NONCE_i i STATUS DETAIL``;
the parent counts only the first line of each test that carries that test's nonce, which the
program never sees before the test is judged (it is in no file, environment variable, argv or
output; reading an earlier test's line back tells nothing of the next test's nonce).
So ``sys.exit(0)`` or ``os._exit(0)`` before the tests leaves the tests unreported (failed), printing
"passed" fakes nothing, and the tests run with a fresh copy of the builtins (with the program's own
global names that shadow a builtin removed), so patching ``builtins``/``AssertionError``/``len`` does
not change how a test is judged. What it cannot stop: a program that reads this process's own memory
(frame introspection, ctypes) can find the nonce; docs/rewards.md says so.

Job (JSON): nonces (one per test), kind ("asserts" | "stdio"), solution, setup, tests (assert sources) or inputs
(stdin texts), limits {cpu_s, memory_mb, file_mb, open_files, processes}, uid (or null), max_output.
"""

import builtins
import io
import json
import os
import resource
import sys


def _read_job(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return json.loads(b"".join(chunks).decode("utf-8"))


def _limit(limits, uid):
    mb = 1024 * 1024
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the soft limit, SIGKILL 1 s later
    pairs = [(resource.RLIMIT_AS, int(limits["memory_mb"]) * mb),
             (resource.RLIMIT_FSIZE, int(limits["file_mb"]) * mb), (resource.RLIMIT_NOFILE, int(limits["open_files"])),
             (resource.RLIMIT_CORE, 0)]
    for what, value in pairs:
        resource.setrlimit(what, (value, value))
    if uid is not None and os.getuid() == 0:  # root: become an unprivileged uid of this execution alone
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    # RLIMIT_NPROC counts every process of the uid: an execution's own uid has none yet; a user's
    # own uid has its other processes, which the limit must leave room for (the harness forks once).
    n = int(limits["processes"]) + (0 if uid is not None else _processes_of(os.getuid()))
    resource.setrlimit(resource.RLIMIT_NPROC, (n, n))


def _processes_of(uid):
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat("/proc/" + name).st_uid == uid
            except OSError:
                pass
    return count


def _reason(error, memory=MemoryError, assertion=AssertionError, isinstance=isinstance):
    if isinstance(error, memory):
        return "memory", "MemoryError"
    if isinstance(error, assertion):
        return "fail", "AssertionError"
    text = str(error).strip().splitlines()
    return "error", type(error).__name__ + (": " + text[0][:200] if text else "")


def _test_globals(namespace, clean):
    """The program's names for the tests, without those that shadow a builtin, and fresh builtins."""
    names = {k: v for k, v in namespace.items() if k not in clean and k != "__builtins__"}
    names["__builtins__"] = clean.copy()
    return names


def _run_asserts(job, report, clean, run=exec, comp=compile, scope=_test_globals, reason=_reason,
                 Base=BaseException, enum=enumerate):
    # The names this loop needs are bound as locals (default arguments, evaluated before the program
    # runs): a program that patches builtins or this module's globals cannot swap `exec` for a no-op.
    tests = list(job["tests"])
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        run(comp(job.get("setup") or "", "<setup>", "exec"), namespace)
        run(comp(job["solution"], "<solution>", "exec"), namespace)
    except Base as e:  # SystemExit and KeyboardInterrupt included: every test then fails
        status, detail = reason(e)
        for i in range(len(tests)):
            report(i, status, "solution: " + detail)
        return
    for i, test in enum(tests):
        try:
            run(comp(test, f"<test {i}>", "exec"), scope(namespace, clean))
        except Base as e:
            report(i, *reason(e))
        else:
            report(i, "pass", "")


def _run_stdio(job, report, clean, max_output):
    real_in, real_out = sys.stdin, sys.stdout
    for i, text in enumerate(job["inputs"]):
        sys.stdin, sys.stdout = io.StringIO(text), io.StringIO()
        try:
            exec(compile(job["solution"], "<solution>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
        except SystemExit as e:  # exit() after printing the answer is fine for a stdin/stdout program
            failed = None if e.code in (None, 0) else ("error", f"SystemExit: {e.code!r}")
        except BaseException as e:
            failed = _reason(e)
        else:
            failed = None
        out, sys.stdin, sys.stdout = sys.stdout, real_in, real_out
        if failed:
            report(i, *failed)
        else:  # the parent compares the output with the expected one, outside the sandbox
            report(i, "out", json.dumps(out.getvalue()[:max_output]) if isinstance(out, io.StringIO) else '""')


def main():
    job = _read_job(int(sys.argv[1]))
    nonces, write, results = job.pop("nonces"), os.write, int(sys.argv[2])

    def report(i, status, detail):
        text = detail if status == "out" else " ".join(str(detail).split())
        write(results, f"{nonces[i]} {i} {status} {text}\n".encode("utf-8", "replace"))

    _limit(job["limits"], job.get("uid"))
    child = os.fork()  # the program's parent is this disposable process, not the trainer
    if child:
        _, status = os.waitpid(child, 0)
        os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    clean = dict(builtins.__dict__)
    if job["kind"] == "stdio":
        _run_stdio(job, report, clean, int(job.get("max_output", 65536)))
    else:
        _run_asserts(job, report, clean)
    for stream in (sys.stdout, sys.stderr):  # what the program printed, for the samples
        try:
            stream.flush()
        except BaseException:
            pass
    os._exit(0)  # no atexit handlers or threads of the program run after the report


if __name__ == "__main__":
    main()
