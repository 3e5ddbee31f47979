"""A local Flower federation on 127.0.0.1, started with Flower's own commands (flwr 1.42).

Deployment, secure as Flower documents it: `credentials.write_credentials` makes a CA, the
SuperLink's TLS certificate and one key pair per SuperNode; the SuperLink serves TLS
(`--ssl-ca-certfile`, `--ssl-certfile`, `--ssl-keyfile`) and admits registered SuperNodes only
(`--enable-supernode-auth`); each node's public key is registered with `flwr supernode
register`; each SuperNode (`partition-id` i of `num-partitions` n) trusts the CA
(`--root-certificates`) and signs in with its private key (`--auth-supernode-private-key`);
then `flwr run <app> <connection> --stream` submits the app over TLS (the connection's
`root-certificates`) and streams its logs until the run ends; each TRAIN message starts a
ClientApp process on its node. Simulation, local only: a SuperLink in simulation mode with
`--insecure` on 127.0.0.1 (nothing leaves this machine), then the same `flwr run` with
`num-supernodes` simulated nodes (Ray). Flower's CLI finds the SuperLink through the connection
in `$FLWR_HOME/config.toml`, which this module writes into its own folder.

`shell_commands()` writes the same commands as shell lines (book/flower.md shows them, and
tests/test_flower.py checks that the page shows what this module runs).
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .credentials import CA_CERT, SERVER_CERT, SERVER_KEY, node_key, write_credentials

__all__ = ["LocalFederation", "PortsUnavailable", "free_port", "shell_commands", "run_config_arg"]

CONNECTION = "local-deployment"
SIM_CONNECTION = "local-simulation"


class PortsUnavailable(RuntimeError):
    """No TCP port could be bound on 127.0.0.1."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    except OSError as err:
        raise PortsUnavailable(f"cannot bind a TCP port on 127.0.0.1: {err}") from err


def run_config_arg(run_config: dict[str, Any]) -> str:
    """`flwr run --run-config`'s argument: space-separated TOML key=value pairs."""
    def toml(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v) if isinstance(v, str) else repr(v)
    return " ".join(f"{k}={toml(v)}" for k, v in run_config.items())


def _superlink(port: int, simulation: bool, secure: bool) -> list[str]:
    security = (["--ssl-ca-certfile", CA_CERT, "--ssl-certfile", SERVER_CERT, "--ssl-keyfile", SERVER_KEY,
                 "--enable-supernode-auth"] if secure else ["--insecure"])
    return ["flower-superlink", *security, *(["--simulation"] if simulation else []),
            "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(port)]


def _credentials(num_nodes: int) -> list[str]:
    return ["python", "-m", "fedsteer_lib.flower.credentials", "--nodes", str(num_nodes)]


def _register(partition: int, connection: str) -> list[str]:
    return ["flwr", "supernode", "register", f"{node_key(partition)}.pub", connection]


def _supernode(link_port: int, node_port: int, partition: int, num_nodes: int, extra: str = "",
               secure: bool = True) -> list[str]:
    config = f"partition-id={partition} num-partitions={num_nodes}" + (f" {extra}" if extra else "")
    security = (["--root-certificates", CA_CERT, "--auth-supernode-private-key", node_key(partition)] if secure
                else ["--insecure"])
    return ["flower-supernode", *security, "--superlink", f"127.0.0.1:{link_port}", "--port", str(node_port),
            "--node-config", config]


def _flwr_run(app: str, connection: str, run_config: dict[str, Any], simulation_nodes: int = 0) -> list[str]:
    cmd = ["flwr", "run", app, connection, "--stream"]
    if run_config:
        cmd += ["--run-config", run_config_arg(run_config)]
    if simulation_nodes:
        cmd += ["--federation-config", f"num-supernodes={simulation_nodes}"]
    return cmd


def _connections(port: int, connection: str, root_certificates: str | None) -> str:
    """The connection: TLS with `root-certificates` (Flower wants an absolute path), else insecure."""
    security = f'root-certificates = "{root_certificates}"\n' if root_certificates else "insecure = true\n"
    return (f'[superlink]\ndefault = "{connection}"\n\n[superlink.{connection}]\n'
            f'address = "127.0.0.1:{port}"\n' + security)


def shell_commands(app: str = "examples/flower_app", num_nodes: int = 3, link_port: int = 9093,
                   node_ports: int = 9101, run_config: dict[str, Any] | None = None,
                   simulation: bool = False, folder: str = "/path/to/fedsteer-book") -> tuple[list[str], str]:
    """What `LocalFederation` runs, with fixed ports, from `folder` (where the credentials are
    written): the shell lines, and the connection that `$FLWR_HOME/config.toml` (by default
    ~/.flwr/config.toml) must hold. A deployment is secure (TLS and SuperNode authentication),
    a simulation local only (`--insecure`)."""
    connection, secure = (SIM_CONNECTION, False) if simulation else (CONNECTION, True)
    if simulation:
        lines = [shlex.join(_superlink(link_port, True, False)) + " &"]
    else:
        lines = [shlex.join(_credentials(num_nodes)), shlex.join(_superlink(link_port, False, True)) + " &"]
        lines += [shlex.join(_register(i, connection)) for i in range(num_nodes)]
        lines += [shlex.join(_supernode(link_port, node_ports + i, i, num_nodes)) + " &" for i in range(num_nodes)]
    lines.append(shlex.join(_flwr_run(app, connection, run_config or {}, num_nodes if simulation else 0)))
    return lines, _connections(link_port, connection, f"{folder}/{CA_CERT}" if secure else None)


class LocalFederation:
    """Start with `with LocalFederation(folder, num_nodes=3) as fed: fed.run(app, {...})`.

    folder: where the federation keeps its FLWR_HOME, credentials, logs and state. simulation: a
    simulation SuperLink and no SuperNodes, local only (`--insecure`). node_config: extra node
    config per node (e.g. "participation-prob=0.5"). A deployment is secure (TLS and SuperNode
    authentication, see the module docstring). Every process it starts is stopped on exit, by its id."""

    def __init__(self, folder: str | Path, num_nodes: int, simulation: bool = False,
                 node_config: list[str] | None = None, startup_timeout: float = 120.0) -> None:
        self.folder = Path(folder).resolve()
        self.num_nodes, self.simulation, self.secure = num_nodes, simulation, not simulation
        self.node_config = node_config or [""] * num_nodes
        self.startup_timeout = startup_timeout
        self.link: subprocess.Popen | None = None
        self.nodes: list[subprocess.Popen | None] = []
        self.port = free_port()
        self.node_ports = [free_port() for _ in range(0 if simulation else num_nodes)]
        self.connection = SIM_CONNECTION if simulation else CONNECTION

    @property
    def env(self) -> dict[str, str]:
        """The environment of every command: Flower's executables of this Python first on PATH
        (the SuperLink and SuperNodes start `flwr-serverapp` / `flwr-clientapp` by name), our
        FLWR_HOME, one torch thread per process."""
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.update({"FLWR_HOME": str(self.folder / "flwr-home"), "OMP_NUM_THREADS": "1",
                    "FLWR_DISABLE_UPDATE_CHECK": "1"})
        return env

    def _start(self, cmd: list[str], log_name: str) -> subprocess.Popen:
        log = open(self.folder / log_name, "w")
        return subprocess.Popen(cmd, env=self.env, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def _wait_for_port(self, port: int, proc: subprocess.Popen, what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with code {proc.returncode}; see {self.folder}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"{what} did not listen on 127.0.0.1:{port} within {self.startup_timeout} s")

    def __enter__(self) -> LocalFederation:
        (self.folder / "flwr-home").mkdir(parents=True, exist_ok=True)
        if self.secure:
            write_credentials(self.folder, self.num_nodes)
        root = str(self.folder / CA_CERT) if self.secure else None
        (self.folder / "flwr-home" / "config.toml").write_text(_connections(self.port, self.connection, root))
        try:
            self.link = self._start(_superlink(self.port, self.simulation, self.secure), "superlink.log")
            self._wait_for_port(self.port, self.link, "the SuperLink")
            for i in range(len(self.node_ports) if self.secure else 0):
                self._register(i)
            for i, node_port in enumerate(self.node_ports):
                cmd = _supernode(self.port, node_port, i, self.num_nodes, self.node_config[i], self.secure)
                self.nodes.append(self._start(cmd, f"supernode-{i}.log"))
            for i, node_port in enumerate(self.node_ports):
                self._wait_for_port(node_port, self.nodes[i], f"SuperNode {i}")
        except BaseException:
            self.stop()
            raise
        return self

    def _register(self, partition: int) -> None:
        """`flwr supernode register`: SuperNode `partition`'s public key, so that the SuperLink admits it."""
        done = subprocess.run(_register(partition, self.connection), env=self.env, cwd=self.folder,
                              capture_output=True, text=True, timeout=self.startup_timeout)
        (self.folder / f"register-{partition}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"flwr supernode register failed for SuperNode {partition} (exit code "
                               f"{done.returncode}); see {self.folder / f'register-{partition}.log'}")

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start_run(self, app: str | Path, run_config: dict[str, Any]) -> subprocess.Popen:
        """Start `flwr run app <connection> --stream` with `run_config`; it ends when the run has
        ended. Its output goes to flwr-run.log."""
        cmd = _flwr_run(str(Path(app).resolve()), self.connection, run_config,
                        self.num_nodes if self.simulation else 0)
        return subprocess.Popen(cmd, env=self.env, cwd=self.folder, stdout=open(self.folder / "flwr-run.log", "w"),
                                stderr=subprocess.STDOUT, start_new_session=True)

    def run(self, app: str | Path, run_config: dict[str, Any], timeout: float | None = 600.0) -> int:
        """`start_run`, waited for; returns flwr run's exit code."""
        proc = self.start_run(app, run_config)
        try:
            return proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def log(self, name: str = "flwr-run.log") -> str:
        return (self.folder / name).read_text(errors="replace")

    def kill_node(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Stop SuperNode i (and the ClientApp it runs) with `sig`."""
        proc = self.nodes[i]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop every process this federation started: each one's whole process group (the
        SuperLink's holds the ServerApp and, in simulation, Ray's processes; a SuperNode's its
        ClientApps), politely first."""
        procs = [p for p in [*self.nodes, self.link] if p is not None]
        for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            for proc in procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            deadline = time.monotonic() + grace
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if not any(_group_alive(p.pid) for p in procs):
                break


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False
