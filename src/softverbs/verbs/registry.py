"""Which devices exist, and opening them.

Three kinds of device, one way to open them:

* **in-process** devices (``sv0`` by default) share the process-wide
  in-process fabric; every one is reachable from the others by GID.  Each
  has an identity address (127.0.0.N) from which its GIDs are derived, the
  way rxe derives them from its netdev: index 0 a link-local IPv6 GID from
  the device's MAC, index 1 the IPv4-mapped GID.  No socket is opened.
* **UDP** devices come from the ``softverbs link`` table
  (:mod:`softverbs.config`): each is bound to a netdev or to addresses and
  speaks RoCEv2 over UDP (:mod:`softverbs.fabric.udp`), with a progress
  thread.  It starts when the first context opens it and stops when the
  last one closes (or at exit).
* **simulated** devices belong to a :class:`~softverbs.sim.Simulation`: an
  isolated in-process fabric on a virtual clock.  While a simulation is
  active (``with Simulation(): ...``), device names resolve to its devices.

A :class:`Registry` holds the specs and open devices of one world; the
default world is the process's, and each simulation pushes its own.
Environment settings that every runtime honours: ``SOFTVERBS_FAULTS``
(seeded fault rules, :mod:`softverbs.fabric.faults`) and
``SOFTVERBS_PCAP`` (a pcap file capturing the device's traffic).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import random
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from softverbs import config
from softverbs.device import ops, records
from softverbs.device.core import Device, DeviceInfo, Features, Host, Owner, Resources
from softverbs.engine.congestion import CCConfig
from softverbs.engine.hca import HCA
from softverbs.engine.memory import KeyByteSource
from softverbs.errors import ConfigError, PyverbsRDMAError
from softverbs.fabric.runtime import Clock, DeviceRuntime, InprocRuntime, Runtime
from softverbs.trace import environment_trace, trace_device
from softverbs.verbs.memory import SelfMemory
from softverbs.verbs.provider import EmbeddedProvider, Provider

if TYPE_CHECKING:
    from softverbs.fabric.pcap import PcapWriter
    from softverbs.verbs.device import Context


def eui64_gid(mac: bytes) -> bytes:
    """The IPv6 link-local GID of a MAC address (modified EUI-64)."""
    eui = bytes([mac[0] ^ 0x02]) + mac[1:3] + b"\xff\xfe" + mac[3:6]
    return b"\xfe\x80" + b"\x00" * 6 + eui


@dataclass
class DeviceSpec:
    """How to build one device."""

    name: str
    kind: str = "inproc"  #: "inproc", "host" (in the device service), "udp" or "sim"
    addrs: tuple[str, ...] = ()
    netdev: str = ""
    mtu: int = 0  #: active IB MTU in bytes; 0 = derived from the netdev
    mac: bytes = b"\x02\x00\x00\x00\x00\x01"
    cc: str = ""  #: congestion control (engine/congestion.py); "" = the default
    cc_params: tuple[tuple[str, int], ...] = ()  #: its parameters, by mlx5's knob names

    @property
    def guid(self) -> int:
        return int.from_bytes(eui64_gid(self.mac)[8:], "big")


@dataclass
class SoftDevice:
    """One open device: its engine, the runtime that drives it, its contexts."""

    spec: DeviceSpec
    hca: HCA | None  #: None when the engine runs in the device service
    runtime: DeviceRuntime
    index: int
    mtu: int
    provider: Provider  #: an EmbeddedProvider, or the device service's ServiceProvider
    contexts: weakref.WeakSet[Context] = field(default_factory=weakref.WeakSet)
    core: Device | None = None  #: the device's authority, when it runs in this process
    #: the application's rings by (WQ kind, handle): where a polled CQE gives a slot back
    rings: dict[tuple[int, int], Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def guid(self) -> int:
        return self.spec.guid


def _ifindex(netdev: str) -> int:
    """The kernel's index of ``netdev`` (0 for none, as for in-process devices)."""
    if not netdev:
        return 0
    import socket

    try:
        return socket.if_nametoindex(netdev)
    except OSError:
        return 0


def _netdev_mac(netdev: str) -> bytes | None:
    try:
        text = Path(f"/sys/class/net/{netdev}/address").read_text().strip()
        mac = bytes.fromhex(text.replace(":", ""))
    except (OSError, ValueError):
        return None
    return mac if len(mac) == 6 and any(mac) else None


def _addr_mac(addr: str, index: int) -> bytes:
    """A stable locally administered MAC for a device known only by address."""
    tail = bytes(int(x) for x in addr.split(".")) if addr.count(".") == 3 else bytes(4)
    return bytes([0x02, index & 0xFF]) + tail


class Registry:
    """The devices of one world: the process, or one simulation."""

    def __init__(self, specs: list[DeviceSpec] | None = None, clock: Clock | None = None,
                 host_device: bool = False, key_seed: int | None = None,
                 inproc: InprocRuntime | None = None) -> None:  # fmt: skip
        self._fixed_specs = specs
        self._clock = clock
        #: None: memory key bytes from os.urandom; else a seeded, reproducible world
        self._key_seed = key_seed
        #: the device service's world: its in-process devices are the host's devices
        self.host_device = host_device
        self._lock = threading.RLock()
        self.devices: dict[str, SoftDevice] = {}
        #: the runtime of the in-process devices (made on first use unless given)
        self._inproc: InprocRuntime | None = inproc
        self._inproc_ready = False
        #: the authority over this world's devices, and this process as their owner
        self.host = Host(self._open_core, self.entries)
        self.host.on_idle = self._idle
        self.owner = self.host.add_owner(Owner(f"pid {os.getpid()}", os.getpid(), os.getuid(),
                                               SelfMemory()))  # fmt: skip

    def entries(self) -> list[records.DeviceEntry]:
        """The devices of this world, as LIST_DEVICES describes them."""
        kinds = {"inproc": 2, "sim": 2, "udp": 1, "host": 0}
        return [records.DeviceEntry(s.name, s.guid, i, 1, 0, kinds.get(s.kind, 2))
                for i, s in enumerate(self.specs())]  # fmt: skip

    # --- specs ---------------------------------------------------------------
    def specs(self) -> list[DeviceSpec]:
        if self._fixed_specs is not None:
            return self._fixed_specs
        kind = "host" if self.host_device else "inproc"
        specs = [
            DeviceSpec(name=n, kind=kind, addrs=(f"127.0.0.{i + 1}",),
                       mac=bytes([2, 0, 0, 0, 0, i + 1]))
            for i, n in enumerate(config.inproc_names())
        ]  # fmt: skip
        for i, link in enumerate(config.load_links()):
            mac = (_netdev_mac(link.netdev) if link.netdev else None) or _addr_mac(
                link.addrs[0] if link.addrs else "", 0x10 + i
            )
            specs.append(DeviceSpec(link.name, "udp", tuple(link.addrs), link.netdev,
                                    link.mtu, mac, link.cc,
                                    tuple(sorted(link.cc_params.items()))))  # fmt: skip
        return specs

    # --- runtimes --------------------------------------------------------------
    def inproc_runtime(self) -> InprocRuntime:
        if not self._inproc_ready:
            if self._inproc is None:
                self._inproc = InprocRuntime(self._clock)
            self._inproc_ready = True
            _apply_environment(self._inproc)
            self._sanitize()
        assert self._inproc is not None
        return self._inproc

    def _build(self, spec: DeviceSpec, index: int) -> SoftDevice:
        if spec.kind == "udp":
            return self._build_udp(spec, index)
        from softverbs.fabric.udp import explicit_addresses

        addrs = explicit_addresses(list(spec.addrs))
        gids = [eui64_gid(spec.mac)] + [a.gid for a in addrs]
        hca = HCA(spec.name, gids, self._key_bytes(spec.name))
        runtime = self.inproc_runtime()
        trace_device(hca, runtime.clock)
        runtime.attach(hca)
        return self._device(spec, index, hca, runtime, spec.mtu or 4096)

    def _key_bytes(self, name: str) -> KeyByteSource:
        """The random source of a device's memory key bytes (engine/memory.py):
        unpredictable, or -- in a seeded world -- the same for the same seed and
        device."""
        seed: int | str = (os.urandom(16).hex() if self._key_seed is None
                           else f"{self._key_seed}:{name}")  # fmt: skip
        return functools.partial(random.Random(seed).getrandbits, 8)

    def _device(self, spec: DeviceSpec, index: int, hca: HCA, runtime: Runtime,
                mtu: int) -> SoftDevice:  # fmt: skip
        """The device's authority over ``hca``, and this process's provider for it."""
        info = DeviceInfo(spec.name, spec.guid, mtu, spec.netdev, _ifindex(spec.netdev),
                          {"udp": 1, "host": 0}.get(spec.kind, 2), Features())  # fmt: skip
        core = Device(info, hca, runtime)
        provider = EmbeddedProvider(self.host, self.owner, core, runtime)
        return SoftDevice(spec, hca, runtime, index, mtu, provider, core=core)

    def _build_udp(self, spec: DeviceSpec, index: int) -> SoftDevice:
        from softverbs.fabric.udp import (
            UdpRuntime,
            bind_error_hint,
            explicit_addresses,
            ib_mtu_for,
            netdev_addresses,
            netdev_of_address,
        )

        environment_trace()  # a bad SOFTVERBS_TRACE fails before the port is bound
        cc = None
        if spec.cc:  # a bad congestion control fails before the port is bound too
            try:
                cc = CCConfig(spec.cc, dict(spec.cc_params))
            except ValueError as exc:
                raise ConfigError(f"device {spec.name}: {exc} (see 'softverbs link set')") from None
        if spec.netdev:
            netdev_mtu, addrs = netdev_addresses(spec.netdev)
        else:
            addrs = explicit_addresses(list(spec.addrs))
            netdev_mtu = netdev_of_address(addrs[0].text)[1] if addrs else 1500
        try:
            runtime = UdpRuntime(addrs, self._clock)
        except OSError as exc:
            raise PyverbsRDMAError(
                f"cannot open device {spec.name}: binding UDP port 4791 on "
                f"{', '.join(a.text for a in addrs)} failed ({exc.strerror}): "
                f"{bind_error_hint(exc)}",
                exc.errno or 0,
            ) from None
        _apply_environment(runtime)
        hca = HCA(spec.name, runtime.gids, self._key_bytes(spec.name))
        if cc is not None:
            hca.cc = cc
        trace_device(hca, runtime.clock)  # checked above: cannot fail now
        runtime.attach(hca)
        runtime.start()
        return self._device(spec, index, hca, runtime, spec.mtu or ib_mtu_for(netdev_mtu))

    def open(self, name: str) -> SoftDevice:
        with self._lock:
            dev = self.devices.get(name)
            if dev is not None:
                return dev
            specs = self.specs()
            for index, spec in enumerate(specs):
                if spec.name == name:
                    dev = self._build(spec, index)
                    self.devices[name] = dev
                    return dev
        raise PyverbsRDMAError(
            f"Failed to find device {name}; softverbs devices are: "
            + (", ".join(s.name for s in specs) or "none")
        )

    def _open_core(self, name: str) -> Device:
        """The host's way to a device: built on first use, as :meth:`open`."""
        core = self.open(name).core
        if core is None:
            raise PyverbsRDMAError(f"device {name} does not run in this process")
        return core

    def release(self, dev: SoftDevice) -> None:
        """The last context of ``dev`` closed: stop a UDP device's runtime."""
        if dev.spec.kind != "udp" or any(not c.closed for c in dev.contexts):
            return
        self._stop(dev)

    def _idle(self, core: Device) -> None:
        """The service's host says nothing uses ``core`` any more: a UDP device
        stops and lets its addresses go (``softverbs link del``, then ``add`` on
        the same address), and is built again by its next open."""
        dev = self.devices.get(core.name)
        if self.host_device and dev is not None and dev.core is core and dev.spec.kind == "udp":
            self._stop(dev)

    def _stop(self, dev: SoftDevice) -> None:
        with self._lock:
            if self.devices.get(dev.name) is dev:
                del self.devices[dev.name]
                self.host.devices.pop(dev.name, None)
        if isinstance(dev.runtime, Runtime) and dev.hca is not None:
            dev.runtime.detach(dev.hca)
        stop = getattr(dev.runtime, "stop", None)
        if stop is not None:
            stop()

    def _sanitize(self) -> None:
        """SOFTVERBS_SANITIZE: the sanitizer watches this process's objects."""
        from softverbs import sanitizer

        if self.host_device:
            return  # softverbsd's own world: its clients ask for themselves (SANITIZE)
        value = sanitizer.from_environment()
        if value is None or self.host.sanitizer is not None:
            return
        out = os.fdopen(os.dup(2), "wb", buffering=0)
        self.host.execute(self.owner, ops.SANITIZE, records.Empty(),
                          Resources(file=out, text=sanitizer.for_python(value),
                                    release=[out.close]))  # fmt: skip

    def shutdown(self) -> None:
        san = self.host.sanitizer
        if san is not None:  # the program exits: what it left behind
            with self.host.lock:
                san.closing(self.owner)
        for dev in list(self.devices.values()):
            stop = getattr(dev.runtime, "stop", None)
            if stop is not None:
                with contextlib.suppress(Exception):
                    stop()
        self.devices.clear()


def _apply_environment(runtime: Runtime) -> None:
    """SOFTVERBS_FAULTS and SOFTVERBS_PCAP, for every runtime in this process."""
    text = environment_faults()
    if text is not None:
        from softverbs.fabric.faults import parse_faults

        runtime.faults = parse_faults(text)
    writer = environment_pcap()
    if writer is not None:
        runtime.add_tap(writer)


def environment_faults() -> str | None:
    """``SOFTVERBS_FAULTS``, checked (None: not set)."""
    text = os.environ.get("SOFTVERBS_FAULTS")
    if not text:
        return None
    from softverbs.fabric.faults import parse_faults

    try:
        parse_faults(text)
    except ValueError as exc:
        raise ConfigError(f"SOFTVERBS_FAULTS: {exc}") from None
    return text


def environment_pcap() -> PcapWriter | None:
    """The process's writer for ``SOFTVERBS_PCAP`` (None: not set)."""
    path = os.environ.get("SOFTVERBS_PCAP")
    if not path:
        return None
    path = path.replace("{pid}", str(os.getpid()))
    try:
        return _pcap_writer(path)
    except OSError as exc:
        raise ConfigError(f"SOFTVERBS_PCAP: cannot write {path}: {exc.strerror}") from None


_pcap_writers: dict[str, PcapWriter] = {}


def _pcap_writer(path: str) -> PcapWriter:
    """One writer per file: every runtime of the process (in-process, each UDP device,
    each simulation) shares it, instead of truncating the file under the others."""
    from softverbs.fabric.pcap import PcapWriter

    key = os.path.abspath(path)
    writer = _pcap_writers.get(key)
    if writer is None:
        writer = _pcap_writers[key] = PcapWriter(path)
        atexit.register(writer.flush)  # not close: a UDP device stopping at exit still sends
    return writer
