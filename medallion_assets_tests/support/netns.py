"""Test hosts on this machine: network namespaces on one bridge, each with an address of its own.

A :class:`Network` is a bridge in the root namespace holding the first address of
a private /24 (``10.213.<n>.1``), and one namespace per :class:`Host`, joined to
the bridge by a veth pair (``eth0`` inside, its address ``10.213.<n>.<10+i>``,
loopback up). The hosts reach each other and the root namespace through the
bridge; nothing routes further (no gateway, no NAT), so a host reaches nothing
but the other test hosts and the servers the test runs on the bridge's address.

A namespace separates the network only: the hosts share this machine's files.
What must not be shared between them (a worker's work folder, its temporary
folder, the lake) is the test's to keep apart.

Processes started on a host (:meth:`Host.start`) run as ``ip netns exec <ns>
<command>`` in a session of their own, so their group is their own id and
:meth:`Network.close` stops them by it (SIGTERM, then SIGKILL) before it deletes
the links and namespaces. Names carry a random token: tests on several xdist
workers each build their own network, on a /24 no route of this machine uses.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from medallion_assets_tests.support.processes import start_logged, stop_group

#: The /16 the test networks take their /24s from.
TEST_RANGE = ipaddress.IPv4Network("10.213.0.0/16")


class NetnsUnavailable(RuntimeError):
    """This machine does not let the tests make network namespaces (no ``ip``, not root, no CAP_NET_ADMIN)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


def why_unavailable() -> str | None:
    """Why the tests cannot make network namespaces here, or ``None`` when they can (a probe namespace is
    added and deleted)."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make network namespaces"
    probe = f"mdl{secrets.token_hex(4)}probe"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"`ip netns add` is not permitted here (root with CAP_NET_ADMIN needed): {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True, timeout=30)
    return None


@dataclass
class Host:
    """One test host: a network namespace with one address on the test network.

    Attributes:
        name: the host's name in the test (``master``, ``worker-b``...).
        namespace: the namespace's name (``ip netns``).
        address: its IPv4 address on the bridge.
    """

    name: str
    namespace: str
    address: str
    processes: list[subprocess.Popen] = field(default_factory=list, repr=False)

    def command(self, args: list[str]) -> list[str]:
        """``args`` as a command run on this host."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def start(self, args: list[str], *, log: Path, env: dict[str, str] | None = None, cwd=None) -> subprocess.Popen:
        """Starts ``args`` on this host in a session of its own, output in ``log``; the network stops it."""
        process = start_logged(self.command(args), cwd=cwd, log=log, env=env)
        self.processes.append(process)
        return process


class Network:
    """A bridge and its hosts; :meth:`close` (or leaving the ``with`` block) takes all of it down.

    Attributes:
        address: the bridge's address in the root namespace: servers the hosts must reach
            (and the test process too) listen there.
    """

    def __init__(self) -> None:
        self.token = secrets.token_hex(3)
        self.subnet = _free_subnet()
        self.address = str(self.subnet.network_address + 1)
        self.bridge = f"mdl{self.token}br"
        self.hosts: list[Host] = []
        self._links: list[str] = []
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.address}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def add_host(self, name: str) -> Host:
        """A new namespace on the bridge, loopback and ``eth0`` up, with the next address."""
        index = len(self.hosts)
        host = Host(name, f"mdl{self.token}-{name}", str(self.subnet.network_address + 10 + index))
        link = f"mdl{self.token}h{index}"
        _ip("netns", "add", host.namespace)
        self.hosts.append(host)
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", host.namespace)
        self._links.append(link)
        _ip("link", "set", link, "master", self.bridge, "up")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", host.namespace, "link", "set", "eth0", "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Stops every process started on a host (by its group id), then deletes the links,
        namespaces and bridge. Keeps going past what is already gone."""
        for host in self.hosts:
            for process in reversed(host.processes):
                stop_group(process, grace=10)
        for link in self._links:
            subprocess.run(["ip", "link", "delete", link], capture_output=True, timeout=30)
        for host in self.hosts:
            subprocess.run(["ip", "netns", "delete", host.namespace], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, timeout=30)
        self.hosts, self._links = [], []

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of :data:`TEST_RANGE` that no address of this machine's root namespace is on."""
    done = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=30)
    used = {ipaddress.IPv4Interface(part.split()[0]).network for part in done.stdout.split(" inet ")[1:]}
    candidates = list(TEST_RANGE.subnets(new_prefix=24))[1:]
    for _ in range(50):
        subnet = candidates[secrets.randbelow(len(candidates))]
        if not any(subnet.overlaps(network) for network in used):
            return subnet
    raise RuntimeError(f"no free /24 in {TEST_RANGE}")


@contextlib.contextmanager
def network(*names: str) -> Iterator[tuple[Network, dict[str, Host]]]:
    """A :class:`Network` with one host per name; yields it and its hosts by name.

    Raises:
        NetnsUnavailable: namespaces cannot be made here (:func:`why_unavailable` says why).
    """
    reason = why_unavailable()
    if reason is not None:
        raise NetnsUnavailable(reason)
    with Network() as net:
        hosts = {name: net.add_host(name) for name in names}
        yield net, hosts


def host_environment(host: Host, folder: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a process on ``host``: Spark binds to its address (``SPARK_LOCAL_IP``), and its
    temporary and local folders are ``host``'s own, under ``folder`` (created)."""
    temp = folder / "tmp"
    temp.mkdir(parents=True, exist_ok=True)
    return {
        **(base if base is not None else os.environ),
        "SPARK_LOCAL_IP": host.address,
        "SPARK_LOCAL_DIRS": str(temp),
        "TMPDIR": str(temp),
    }
