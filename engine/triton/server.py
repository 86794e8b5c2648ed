"""`prune serve`: start a real Triton Inference Server on a model repository.

On CPU machines the server is the `tritonserver` binary that the PyPI package
`nvidia-pytriton` carries, with its python backend (no onnxruntime/tensorrt backends:
the `cpu` repository target runs ONNX Runtime inside the python backend). How it is made
to start (see docs/triton.md): the python-backend stub for this Python goes into a
backends folder, Python's LIBDIR comes first on LD_LIBRARY_PATH (or the stub loads
another libpython), and this interpreter's `bin/` comes first on PATH (the stub finds
packages through the first `python3`; PYTHONPATH is ignored).

Binds 127.0.0.1 unless told otherwise. On GPU servers use NVIDIA's Triton container
instead (docs/triton.md).

The server cannot outlive the process that started it: tritonserver runs in its own
process group (its python-backend stubs with it) and a small watchdog process ends that
group, and removes the server's temporary folder, as soon as its starter is gone, even
when the starter was killed outright (SIGKILL leaves no chance to clean up). `stop()`
drains (SIGINT: in-flight requests finish), waits for the stubs too, and kills what is
left after its timeout.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path

from engine.errors import BackendError
from engine.settings import setting


def _pytriton_dir() -> Path:
    try:
        import pytriton
    except ImportError as exc:
        raise BackendError(
            "no tritonserver binary: pip install 'prune-engine[serve]' "
            "(nvidia-pytriton carries one), or use NVIDIA's Triton container"
        ) from exc
    return Path(pytriton.__file__).resolve().parent / "tritonserver"


def server_binary() -> Path:
    """The tritonserver binary: the tritonserver setting's, else pytriton's."""
    env = setting("tritonserver")
    path = Path(env) if env else _pytriton_dir() / "bin" / "tritonserver"
    if not path.is_file():
        raise BackendError(f"{path}: no tritonserver binary")
    return path


#: Triton APIs that change the server or reach its memory, locked by default: a client
#: could register shared memory and have outputs written into it, or change logging and
#: tracing. (Model loading is off: --model-control-mode=none. Statistics are read-only.)
ADMIN_APIS = ("shared-memory", "trace", "logging")
#: Triton's readiness endpoint (KServe v2), used here and by deploy/kubernetes' startup probe
HEALTH_READY = "/v2/health/ready"
ADMIN_HEADER = "prune-admin-key"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TritonServer:
    """A tritonserver process on a model repository; a context manager."""

    def __init__(
        self,
        repository: str | Path,
        *,
        host: str = "127.0.0.1",
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        log_file: str | Path | None = None,
        forward_logs: bool = False,
        extra_args: list[str] | None = None,
        admin_key: str | None = None,
        restrict_admin: bool = True,
        http: bool = True,
    ):
        """`restrict_admin` (default): the shared-memory, trace and logging APIs answer only
        requests carrying the header `prune-admin-key: <admin_key>`; with no admin_key,
        a random one nobody knows, so they are refused to every client. `http=False`
        turns Triton's HTTP endpoint off (readiness is then asked over gRPC)."""
        self.repository = Path(repository).resolve()
        if not self.repository.is_dir():
            raise BackendError(f"{repository}: no such model repository")
        self.host, self.http_port, self.grpc_port, self.metrics_port = (
            host,
            http_port,
            grpc_port,
            metrics_port,
        )
        self.log_file = Path(log_file) if log_file else None
        self.forward_logs = forward_logs
        self.extra_args = extra_args or []
        self.restrict_admin = restrict_admin
        self.http = http
        self.admin_key = admin_key or setting("admin_key") or None
        self._secret = self.admin_key or secrets.token_hex(24)
        self.proc: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None
        self.tail: deque[str] = deque(maxlen=60)
        self._workdir: tempfile.TemporaryDirectory | None = None

    @property
    def http_url(self) -> str:
        """The HTTP endpoint's URL."""
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """The gRPC endpoint's address."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """The metrics endpoint's URL."""
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def _prepare(self) -> tuple[list[str], dict[str, str]]:
        binary = server_binary()
        if self._workdir:  # a restart after kill()
            self._workdir.cleanup()
        base = _pytriton_dir()
        self._workdir = tempfile.TemporaryDirectory(prefix="prune-triton-")
        work = Path(self._workdir.name)
        py_backend = work / "backends" / "python"
        py_backend.mkdir(parents=True)
        for f in (base / "backends" / "python").iterdir():
            if f.is_file():
                shutil.copy2(f, py_backend / f.name)
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = base / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.is_file():
            raise BackendError(f"no python-backend stub for Python {version} in {base}")
        shutil.copy2(stub, py_backend / stub.name)
        env = dict(os.environ)
        libs = [sysconfig.get_config_var("LIBDIR") or "", str(base.parent.parent / "nvidia_pytriton.libs")]
        env["LD_LIBRARY_PATH"] = ":".join([p for p in libs if p] + [env.get("LD_LIBRARY_PATH", "")]).rstrip(
            ":"
        )
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        cmd = [
            str(binary),
            f"--model-repository={self.repository}",
            f"--backend-directory={work / 'backends'}",
            f"--cache-directory={work / 'caches'}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--strict-readiness=true",
            "--log-verbose=0",
            "--model-control-mode=none",  # no load/unload through the API
            *([] if self.http else ["--allow-http=false"]),
            *self.extra_args,
        ]
        if self.restrict_admin:
            rule = f"{','.join(ADMIN_APIS)}:{ADMIN_HEADER}={self._secret}"
            cmd += [f"--http-restricted-api={rule}", f"--grpc-restricted-protocol={rule}"]
        return cmd, env

    def _pump(self) -> None:
        assert self.proc and self.proc.stdout
        sink = self.log_file.open("a") if self.log_file else None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            if sink:
                sink.write(line + "\n")
                sink.flush()
            if self.forward_logs:
                print(f"[tritonserver] {line}", file=sys.stderr, flush=True)
        if sink:
            sink.close()

    def start(self, timeout: float = 120.0) -> "TritonServer":
        """Start tritonserver and wait until it is ready."""
        cmd, env = self._prepare()
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        assert self._workdir is not None
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine.triton.watchdog",
                str(os.getpid()),
                str(self.proc.pid),
                self._workdir.name,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BackendError(
                    f"tritonserver exited with status {self.proc.returncode}:\n"
                    + "\n".join(list(self.tail)[-25:])
                )
            if self.ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise BackendError(
            f"tritonserver not ready after {timeout:.0f} s:\n" + "\n".join(list(self.tail)[-25:])
        )

    def ready(self) -> bool:
        """Whether the server answers ready."""
        try:
            if not self.http:
                import tritonclient.grpc as grpcclient  # nvidia-pytriton depends on it

                with grpcclient.InferenceServerClient(self.grpc_url) as client:
                    return bool(client.is_server_ready(client_timeout=1))
            with urllib.request.urlopen(f"http://{self.http_url}{HEALTH_READY}", timeout=1) as r:
                return r.status == 200
        except Exception:
            return False

    def stop(self, timeout: float = 15.0) -> bool:
        """Drain and stop the server and its stubs; True when they ended by themselves
        within `timeout` (False: what was left had to be killed)."""
        clean = True
        if self.proc:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
            deadline = time.monotonic() + timeout
            try:
                self.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                clean = False
            while clean and _group_alive(self.proc.pid) and time.monotonic() < deadline:
                time.sleep(0.05)  # the stubs finish after the server
            if _group_alive(self.proc.pid):
                clean = False
                self._kill_group()
        self._end_watchdog()
        if self._workdir:
            self._workdir.cleanup()
            self._workdir = None
        return clean

    def _kill_group(self) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(5)
        for _ in range(50):
            if not _group_alive(self.proc.pid):
                break
            time.sleep(0.1)

    def _end_watchdog(self) -> None:
        if self._watchdog and self._watchdog.poll() is None:
            self._watchdog.kill()
            self._watchdog.wait(5)
        self._watchdog = None

    def stub_pids(self) -> list[int]:
        """The python-backend stub processes of this server (its children)."""
        if not self.proc:
            return []
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if (
                    ppid == self.proc.pid
                    and b"triton_python_backend_stub" in (entry / "cmdline").read_bytes()
                ):
                    out.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
        return out

    def health_problem(self, stubs: int) -> str | None:
        """Why the server cannot serve (it exited, or fewer than `stubs` stubs are alive:
        Triton keeps a model whose stub died "ready" while it fails every request), or None."""
        if not self.proc:
            return "not started"
        if self.proc.poll() is not None:
            return f"tritonserver exited with status {self.proc.returncode}"
        alive = len(self.stub_pids())
        if alive < stubs:
            return f"{stubs - alive} python-backend stub(s) died"
        return None

    def supervise(
        self,
        *,
        ready_timeout: float = 120.0,
        restart: bool = True,
        max_restarts: int = 5,
        alive: Callable[[], bool] = lambda: True,
        log: Callable[[str], None] = print,
        interval: float = 0.5,
    ) -> str:
        """Keep the started server serving until it cannot be: a server that died (one
        malformed request can abort tritonserver 2.51) or lost a stub (its model then fails
        every request while "ready") is restarted, at most `max_restarts` times in a minute
        (never with `restart=False`). Returns why it stopped: that problem, or that `alive()`
        (what runs in front of the server, such as the HTTP API) turned false. Signals and
        KeyboardInterrupt propagate to the caller, who stops the server."""
        stubs = len(self.stub_pids())
        restarts: list[float] = []
        while True:
            time.sleep(interval)
            if not alive():
                return "the HTTP API stopped"
            problem = self.health_problem(stubs)
            if problem is None:
                continue
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < 60] + [now]
            if not restart or len(restarts) > max_restarts:
                return problem + (
                    "" if not restart else f"; more than {max_restarts} restarts in a minute: giving up"
                )
            log(f"prune serve: {problem}: restarting tritonserver")
            self.stop(timeout=5)
            self.start(timeout=ready_timeout)
            stubs = len(self.stub_pids())
            log(f"prune serve: tritonserver ready again (restart {len(restarts)} in the last minute)")

    def kill(self) -> None:
        """Kill the server and its stubs abruptly (fault tests)."""
        if self.proc and (self.proc.poll() is None or _group_alive(self.proc.pid)):
            self._kill_group()
        self._end_watchdog()

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
