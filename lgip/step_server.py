"""lgip.step_server: run_all's steps started as children forked from one helper process that has imported
torch, torchvision, open_clip, transformers, numpy, PIL and matplotlib once, instead of as new Python
processes that import them again (seconds of CPU a step: on a 2-core machine a demo evaluation step took
10.9 s as a new process, 0.7 s forked, the same outputs).

run_all's STEP_START "fork" (the default; Linux only, elsewhere every step starts fresh) starts the helper
at the first step that runs, so it imports while the generators run (new processes: they import no
torch); an evaluation or the report waits for it, then runs in a child of it. The child is what
`python <script> --NAME=value ...` would be: the caller's standard streams (passed over the helper's
socket), folder and environment, the script's folder first on sys.path, the script run as __main__
(runpy), a new process's signal handlers, its exit status or signal passed back. The helper itself runs
nothing, so every child starts from the same state (no CUDA initialised: the child initialises it as a
new process does), one at a time. A command whose environment differs from the helper's (a library reads
some variables when imported) starts fresh. The helper ends when its starter closes or its caller ends.
STEP_START "fresh" starts every step as a new process: the plain path, which tests/test_step_server.py
compares with this one output by output. (`ps` shows a forked step under the helper's command line.)

    >>> with StepStarter("fork") as starter:
    ...     proc = starter.popen(step.command(), forkable=True)   # subprocess.Popen's pid, wait, send_signal
    ...     rc = proc.wait()
"""
import json
import os
import select
import socket
import subprocess
import sys
import time

# what the helper imports (each when installed): the libraries a model-loading step spends its start on
PRELOAD = ("numpy", "PIL.Image", "torch", "torchvision", "open_clip", "transformers", "matplotlib")
MODES = ("fork", "fresh")


def can_fork():
    """Whether the helper can serve here: Linux (macOS's system libraries are not safe to use after fork)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(socket, "send_fds")


class _Child:
    """A step forked by the helper, as subprocess.Popen shows a process: pid, returncode, wait, poll,
    send_signal, terminate, kill."""

    def __init__(self, starter, pid, args):
        self.starter, self.pid, self.args, self.returncode = starter, pid, args, None

    def wait(self, timeout=None):
        """Its exit status (negative: the signal that ended it); subprocess.TimeoutExpired after `timeout` s."""
        if self.returncode is None:
            reply = self.starter._read(timeout, self.args)
            if reply.get("pid") != self.pid or "returncode" not in reply:
                raise RuntimeError(f"the step helper answered {reply!r} for process {self.pid}")
            self.returncode = int(reply["returncode"])
        return self.returncode

    def poll(self):
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig):
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # (it has just ended: its status is on the way)
                pass

    def terminate(self):
        import signal
        self.send_signal(signal.SIGTERM)

    def kill(self):
        import signal
        self.send_signal(signal.SIGKILL)


def _fd(stream, default):
    return default if stream is None else stream if isinstance(stream, int) else stream.fileno()


class StepStarter:
    """Starts commands (module docstring): `popen(command, forkable, ...)` returns a subprocess.Popen or, for
    a forkable one in mode "fork", a _Child of the helper. A context manager: the helper ends with it."""

    def __init__(self, mode="fork", preload=PRELOAD):
        if mode not in MODES:
            raise ValueError(f"STEP_START must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
        self.mode, self.preload = (mode if can_fork() else "fresh"), tuple(preload)
        self.helper, self.env, self.ready, self._sock = None, None, False, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def start_helper(self):
        """Start the helper (it imports in the background) if this mode uses one and it is not started."""
        if self.mode != "fork" or self.helper is not None:
            return
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = dict(os.environ)
        self.helper = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(theirs.fileno()),
                                        ",".join(self.preload)], pass_fds=(theirs.fileno(),), env=self.env,
                                       stdin=subprocess.DEVNULL)
        theirs.close()

    def popen(self, command, forkable=True, stdin=None, stdout=None, stderr=None, cwd=None, env=None):
        """`command` ([python, script, args...]) started: forked from the helper when `forkable` and it can
        serve (mode "fork", the helper's environment), else as a new process (subprocess.Popen). stdin,
        stdout, stderr: None (this process's) or a file descriptor or file; cwd, env: as Popen's."""
        self.start_helper()
        same_env = dict(os.environ if env is None else env) == self.env
        if not (forkable and self.helper is not None and same_env and self._wait_ready()):
            return subprocess.Popen(command, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=env)
        sys.stdout.flush()
        sys.stderr.flush()
        job = json.dumps({"argv": command[1:], "cwd": os.path.abspath(cwd or os.getcwd())}).encode()
        socket.send_fds(self._sock, [job], [_fd(stdin, 0), _fd(stdout, 1), _fd(stderr, 2)])
        reply = self._read(None, command)
        if "pid" not in reply:
            raise RuntimeError(f"the step helper could not start {command[1]}: {reply.get('error', reply)}")
        return _Child(self, reply["pid"], command)

    def _wait_ready(self):
        if not self.ready:
            reply = self._read(None, ["the step helper"], allow_eof=True)
            self.ready = bool(reply.get("ready"))
            if not self.ready:  # (it could not start: every step starts fresh, as with STEP_START "fresh")
                print(f"note: the step helper did not start ({reply.get('error', 'it ended')}); each step starts "
                      f"as a new process", file=sys.stderr, flush=True)
                self.close()
                self.mode = "fresh"  # (not a new helper at the next step, to fail again)
        return self.ready

    def _read(self, timeout, args, allow_eof=False):
        """The helper's next message as a dict; subprocess.TimeoutExpired after `timeout` s."""
        if not select.select([self._sock], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(args, timeout)
        data = self._sock.recv(65536)
        if not data:
            if allow_eof:
                return {}
            raise RuntimeError("the step helper ended unexpectedly (was it killed?); the step's outcome is "
                               "unknown: run the same command again, or pass --STEP_START=fresh")
        return json.loads(data)

    def close(self):
        """End the helper (it exits when its socket closes)."""
        if self.helper is None:
            return
        self._sock.close()
        try:
            self.helper.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.helper.kill()
            self.helper.wait()
        self.helper = None


def fork_poisoned(in_bad_fork):
    """Whether a child forked now would find CUDA unusable (torch marks its children so once CUDA was touched
    in the parent): `in_bad_fork` (torch._C._cuda_isInBadFork; None without CUDA) asked in a child."""
    if in_bad_fork is None:
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(1 if in_bad_fork() else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0


def _serve(sock, preload):
    """The helper's loop: import `preload`, say ready, then for each request fork a child and report its pid
    and, when it ends, its status. Returns only in a child, with (the job {"argv", "cwd"}, its three fds)."""
    import importlib
    import signal
    # a child gets the handlers a new Python would have: Ctrl-C's default handler, or SIGINT left ignored
    # where the caller was started with it ignored (a shell's `cmd &`), as Python leaves it then
    inherited = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a terminal's Ctrl-C is for the step and run_all, not for this)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def say(**message):
        sock.send(json.dumps(message).encode())

    try:
        # (a library that asks torch whether CUDA is there while it is imported asks NVML, which leaves the
        # children free to initialise CUDA; the variable is gone again before any child starts)
        saved = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        try:
            for name in preload:
                try:
                    importlib.import_module(name)
                except ImportError:
                    pass
        finally:
            del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
            if saved is not None:
                os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = saved
        torch = sys.modules.get("torch")
        if torch is not None and (torch.cuda.is_initialized() or
                                  fork_poisoned(getattr(torch._C, "_cuda_isInBadFork", None))):
            raise RuntimeError("CUDA was initialised while importing: forked children could not use it")
    except Exception as e:  # (the starter starts every step fresh, and says why)
        say(ready=False, error=f"{type(e).__name__}: {e}")
        return None
    import gc
    gc.freeze()  # (what the imports made is never collected: a child's collections skip it, and leave its pages shared)
    say(ready=True)
    while True:
        data, fds, _, _ = socket.recv_fds(sock, 65536, 3)
        if not data:
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sock.close()
            for sig, handler in inherited.items():
                signal.signal(sig, handler)
            return json.loads(data), fds
        for fd in fds:  # (the child's now: a pipe held open here would never end for its reader)
            os.close(fd)
        try:
            say(pid=pid)
            _, status = os.waitpid(pid, 0)
            say(pid=pid, returncode=os.waitstatus_to_exitcode(status))
        except OSError:  # (the caller is gone: so is the reason to serve; the step was waited for)
            return None


def _run_as_main(job, fds):
    """Become `python <script> args...` (module docstring): the caller's streams as 0, 1 and 2 (Python's
    objects over them buffered as a new process's), argv, folder, sys.path, then the script as __main__;
    what it raises (SystemExit included) ends this process as it would end that one."""
    import io
    import runpy
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
        buffered = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(buffered, encoding=old.encoding, errors=old.errors,
                                  line_buffering=fd == 2 or (fd == 1 and raw.isatty()))
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    argv = job["argv"]
    os.chdir(job["cwd"])
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    sys.path.pop(0)  # (this file's folder: lgip's modules are not top-level names for what the helper imports)
    served = _serve(socket.socket(fileno=int(sys.argv[1])), [m for m in sys.argv[2].split(",") if m])
    if served is not None:
        _run_as_main(*served)
