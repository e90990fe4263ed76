"""Simulated hosts: one Linux network namespace each, joined to the root namespace by a veth
pair. Host ``i`` is ``10.231.i.2``; PostgreSQL listens on the root side, ``10.231.i.1``.
Cutting a host sets the root side of its veth down: packets are dropped, TCP connections stay
open and retransmit, as in a real partition; healing sets it up again."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid

__all__ = ["Host", "unavailable"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def unavailable() -> str | None:
    """Why namespaces cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    probe = f"awaprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"cannot create a network namespace: {exc.stderr.strip()}"
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", probe)
    return None


class Host:
    """One simulated host (its namespace and veth), created by :meth:`create`."""

    def __init__(self, index: int, tag: str) -> None:
        self.index = index
        self.name = f"host{index}"
        self.netns = f"awa{tag}{index}"
        self.veth = f"awa{tag}{index}"  # root side; the peer inside is "<veth>p"
        self.server_addr = f"10.231.{index}.1"
        self.addr = f"10.231.{index}.2"

    def create(self) -> None:
        peer = f"{self.veth}p"
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", self.netns)
        _ip("addr", "add", f"{self.server_addr}/24", "dev", self.veth)
        _ip("link", "set", self.veth, "up")
        inside = ["netns", "exec", self.netns, "ip"]
        _ip(*inside, "addr", "add", f"{self.addr}/24", "dev", peer)
        _ip(*inside, "link", "set", peer, "up")
        _ip(*inside, "link", "set", "lo", "up")

    def cut(self) -> None:
        _ip("link", "set", self.veth, "down")

    def heal(self) -> None:
        _ip("link", "set", self.veth, "up")

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", self.veth)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", self.netns)
