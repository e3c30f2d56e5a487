"""Memory keys in a Simulation: random key bytes, drawn from the simulation's seed.

Keys are ``index << 8 | byte`` with an unpredictable byte (engine/memory.py);
a seeded simulation must stay reproducible, so its bytes come from its seed.
"""

from __future__ import annotations

from softverbs import MR, PD, Context
from softverbs.enums import IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE
from softverbs.sim import Simulation


def _keys(**sim: object) -> list[tuple[int, int]]:
    with Simulation(devices=("a", "b"), **sim) as _:  # type: ignore[arg-type]
        out = []
        for dev in ("a", "b"):
            ctx = Context(name=dev)
            pd = PD(ctx)
            for _i in range(8):
                mr = MR(pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
                out.append((mr.lkey, mr.rkey))
        return out


def test_seeded_simulation_reproduces_its_keys() -> None:
    assert _keys(seed=5) == _keys(seed=5)
    assert _keys(faults="seed=9;drop=0") == _keys(seed=9)
    assert _keys() == _keys(), "an unseeded simulation is seed 0: reproducible too"


def test_seed_changes_the_key_bytes() -> None:
    a, b = _keys(seed=1), _keys(seed=2)
    assert [k >> 8 for k, _ in a] == [k >> 8 for k, _ in b], "indexes do not depend on the seed"
    assert [k & 0xFF for k, _ in a] != [k & 0xFF for k, _ in b]
    bytes_a = [k & 0xFF for k, _ in a]
    assert len(set(bytes_a)) > 4, bytes_a
