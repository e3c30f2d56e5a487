"""Simulation: an isolated in-process fabric on a virtual clock.

Inside ``with Simulation(...) as sim:``, ``Context(name=...)`` opens the
simulation's devices instead of the process's, and everything runs on a
:class:`~softverbs.fabric.runtime.VirtualClock`.  Time moves only when a
program waits -- an empty ``poll`` or a blocking call jumps to the next
timer -- so ACK timeouts, RNR back-offs and delayed packets cost no wall
time, and a run is exactly reproducible: the same program, the same seed
and the same faults give the same packets, at the same virtual times.

::

    with Simulation(devices=("a", "b"), faults="seed=7;drop=0.1") as sim:
        ctx_a, ctx_b = Context(name="a"), Context(name="b")
        ...                          # an ordinary pyverbs program
        print(sim.now, sim.stats)    # virtual seconds; faults applied

Each simulated device has one address (10.0.0.N), so its GID table is
``[fe80::..., ::ffff:10.0.0.N]`` like any rxe device: use GID index 1.

Memory keys carry a random key byte (engine/memory.py); in a simulation the
bytes come from ``seed`` (else the faults' seed, else 0), so the same seed
gives the same lkeys and rkeys.

Congestion
----------
By default the devices hand packets to each other directly.  With
``topology=Topology(...)`` they sit around one switch
(:mod:`softverbs.fabric.switch`): links with a bandwidth and a propagation
delay, egress queues with a buffer, RED/ECN marking and tail drop.  Every
device's congestion control is ``cc`` (``"slow_restart"``, ``"none"`` or
``"dcqcn"``, with ``cc_params`` by mlx5's knob names), or per device with
:meth:`Simulation.set_cc`::

    topo = Topology(bandwidth=10e9, kmin=20_000, kmax=200_000, pmax=0.01)
    with Simulation(devices=("s1", "s2", "r"), topology=topo, cc="dcqcn") as sim:
        ...                          # both senders WRITE to r; the port to r is the bottleneck
        sim.port("r").drops, sim.port("r").marks
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from types import TracebackType

from softverbs.engine.congestion import CCConfig
from softverbs.fabric.faults import FaultInjector, parse_faults
from softverbs.fabric.runtime import InprocRuntime, VirtualClock
from softverbs.fabric.switch import Port, SwitchedRuntime, Topology
from softverbs.verbs import registry, world


class Simulation:
    """An isolated fabric of in-process devices on a virtual clock."""

    def __init__(
        self,
        devices: Sequence[str] = ("sv0", "sv1"),
        *,
        faults: str | FaultInjector | None = None,
        mtu: int = 4096,
        seed: int | None = None,
        topology: Topology | None = None,
        cc: str | None = None,
        cc_params: dict[str, int] | None = None,
    ) -> None:
        self.clock = VirtualClock()
        if isinstance(faults, str):
            faults = parse_faults(faults)
        #: what the simulation's randomness comes from (memory key bytes): ``seed``,
        #: else the faults' seed, else 0 -- a simulation is reproducible
        self.seed = seed if seed is not None else (faults.seed if faults is not None else 0)
        specs = [
            registry.DeviceSpec(
                name=name,
                kind="sim",
                addrs=(f"10.0.0.{i + 1}",),
                mtu=mtu,
                mac=bytes([0x02, 0x5E, 0, 0, 0, i + 1]),
            )
            for i, name in enumerate(devices)
        ]
        self.topology = topology
        switched = None if topology is None else SwitchedRuntime(topology, self.clock)
        self.registry = registry.Registry(specs, clock=self.clock, key_seed=self.seed,
                                          inproc=switched)
        self.runtime: InprocRuntime = self.registry.inproc_runtime()
        if faults is not None:
            self.runtime.faults = faults
        if topology is not None or cc is not None:
            for name in devices:
                self.registry.open(name)  # build them now: their links, their CC
        if cc is not None:
            for name in devices:
                self.set_cc(name, cc, **(cc_params or {}))

    def set_cc(self, device: str, kind: str, **params: int) -> None:
        """Give ``device`` this congestion control (for the QPs it creates or
        resets from now on).  ValueError says what is out of range."""
        hca = self.registry.open(device).hca
        assert hca is not None
        hca.cc = CCConfig(kind, params, line_rate=hca.cc.line_rate)

    def port(self, device: str) -> Port:
        """The switch's egress port toward ``device`` (needs a topology)."""
        if not isinstance(self.runtime, SwitchedRuntime):
            raise ValueError("this simulation has no switch (give it a topology)")
        return self.runtime.egress[device]

    def __enter__(self) -> Simulation:
        world.push(self.registry)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        world.pop(self.registry)
        for dev in list(self.registry.devices.values()):
            for ctx in list(dev.contexts):
                ctx.close()

    @property
    def now(self) -> float:
        """Virtual seconds since the simulation started."""
        return self.clock.now()

    @property
    def stats(self) -> Counter[str]:
        """What the fault layer did (dropped, duplicated, ...)."""
        faults = self.runtime.faults
        return faults.stats if isinstance(faults, FaultInjector) else Counter()

    def run(self, duration: float) -> None:
        """Let ``duration`` virtual seconds pass, firing every timer due."""
        end = self.clock.now() + duration
        with self.runtime.lock:
            self.runtime.progress()
            while True:
                nxt = self.runtime.next_deadline()
                if nxt is None or nxt > end:
                    break
                self.runtime.idle_step()
            self.clock.advance(end)
            self.runtime.progress()
