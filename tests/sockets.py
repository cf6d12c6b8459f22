"""What processes listen on, read from /proc: the tests that hold every server to 127.0.0.1."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

TCP_LISTEN = "0A"
UDP_UNCONNECTED = "07"


@dataclass(frozen=True)
class Listener:
    """One listening socket: its protocol, local address and port, and the process holding it."""

    protocol: str  # tcp, tcp6, udp, udp6
    address: str
    port: int
    pid: int

    def __str__(self) -> str:
        return f"{self.protocol} {self.address}:{self.port} (pid {self.pid}: {command(self.pid)})"


def _address(hex_address: str) -> str:
    """/proc/net's address: IPv4 as one little-endian word, IPv6 as four of them."""
    raw = bytes.fromhex(hex_address)
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
    ip = ipaddress.ip_address(b"".join(words))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # gone, or not ours to read
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def listeners(pids: set[int]) -> list[Listener]:
    """Every TCP socket in LISTEN and every unconnected UDP socket that one of ``pids`` holds."""
    owner = {inode: pid for pid in sorted(pids) for inode in socket_inodes(pid)}
    found = []
    for protocol, state in (
        ("tcp", TCP_LISTEN),
        ("tcp6", TCP_LISTEN),
        ("udp", UDP_UNCONNECTED),
        ("udp6", UDP_UNCONNECTED),
    ):
        table = Path(f"/proc/net/{protocol}")
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != state or fields[9] not in owner:
                continue
            address, port = fields[1].split(":")
            found.append(Listener(protocol, _address(address), int(port, 16), owner[fields[9]]))
    return found


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def descendants(pid: int) -> set[int]:
    """``pid``'s children, their children, and so on (from /proc's parent ids)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def environment_has(variable: str, value: str) -> set[int]:
    """The live processes whose environment sets ``variable`` to ``value``."""
    wanted = f"{variable}={value}".encode()
    found = set()
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if wanted in environ.read_bytes().split(b"\0"):
                found.add(int(environ.parent.name))
        except OSError:
            continue
    return found
