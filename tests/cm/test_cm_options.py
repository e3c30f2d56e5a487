"""rdma_set_option's ID options and the port rules they change, as the
kernel's rdma_cm has them (``ucma_set_option_id``, ``cma_check_port``,
``cma_bind_listen``, ``cma_match_private_data``).

* REUSEADDR: two IDs that both set it share an address and port; a
  listener among them still shares with no one.  It can be turned on in any
  state but LISTEN and off only in IDLE.
* AFONLY: a wildcard bind takes its own address family only, so ``::`` and
  ``0.0.0.0`` can hold the same port (tgt's iSER portals); an IPv4 bind is
  always AFONLY, an IPv6 one as ``net.ipv6.bindv6only`` says.  A wildcard
  IPv6 listener without it also takes IPv4 requests.  It can be set only
  before the address is resolved.
* Value sizes: TOS and ACK_TIMEOUT a uint8_t, REUSEADDR and AFONLY an int;
  anything else EINVAL.  An unknown name or level is ENOSYS.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

import pytest
from cm_kit import A, B, active, expect, qp_init

from softverbs.cm.agent import bindv6only
from softverbs.cm.api import CMID, AddrInfo, CMEventChannel, ConnParam
from softverbs.enums import (
    RAI_PASSIVE,
    RDMA_CM_EVENT_CONNECT_REQUEST,
    RDMA_CM_EVENT_ESTABLISHED,
    RDMA_CM_EVENT_REJECTED,
    RDMA_OPTION_IB,
    RDMA_OPTION_IB_PATH,
    RDMA_OPTION_ID,
    RDMA_OPTION_ID_ACK_TIMEOUT,
    RDMA_OPTION_ID_AFONLY,
    RDMA_OPTION_ID_REUSEADDR,
    RDMA_OPTION_ID_TOS,
    RDMA_PS_TCP,
)
from softverbs.errors import PyverbsRDMAError
from softverbs.sim import Simulation


@pytest.fixture
def sim() -> Iterator[Simulation]:
    with Simulation(devices=("a", "b")) as s:
        yield s


def _id(**options: int) -> tuple[CMEventChannel, CMID]:
    ch = CMEventChannel()
    cid = CMID(creator=ch)
    names = {"reuse": RDMA_OPTION_ID_REUSEADDR, "afonly": RDMA_OPTION_ID_AFONLY}
    for name, value in options.items():
        cid.set_option(RDMA_OPTION_ID, names[name], value, 4)
    return ch, cid


def _bind(cid: CMID, ip: str, port: int) -> None:
    cid.bind_addr(AddrInfo(src=ip, src_service=str(port), flags=RAI_PASSIVE))


def _errno(fn: object, *args: object) -> int:
    with pytest.raises(PyverbsRDMAError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.error_code


def test_reuseaddr_shares_a_port(sim: Simulation) -> None:
    _, one = _id(reuse=1)
    _, two = _id(reuse=1)
    _bind(one, B, 7600)
    _bind(two, B, 7600)  # both asked: shared
    _, plain = _id()
    assert _errno(_bind, plain, B, 7600) == errno.EADDRINUSE
    _, wild = _id()
    assert _errno(_bind, wild, "0.0.0.0", 7600) == errno.EADDRNOTAVAIL
    # a listener shares with no one: the other owner of B:7600 is in the way
    assert _errno(one.listen) == errno.EADDRINUSE
    two.close()
    one.listen()
    # on in any state but LISTEN, off only in IDLE
    assert _errno(one.set_option, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, 1, 4) == errno.EINVAL
    _, bound = _id(reuse=1)
    _bind(bound, A, 7601)
    assert _errno(bound.set_option, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, 0, 4) == \
        errno.EINVAL  # fmt: skip
    bound.set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, 1, 4)


def test_afonly_lets_both_families_hold_a_port(sim: Simulation) -> None:
    _, v6 = _id(afonly=1)
    _bind(v6, "::", 7610)
    _, v4 = _id()
    _bind(v4, "0.0.0.0", 7610)  # IPv4 binds are AFONLY
    v4.listen()
    v6.listen()
    assert _errno(v6.set_option, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, 0, 4) == errno.EINVAL
    # the IPv4 request reaches the IPv4 listener, not the IPv6 one
    ach, act = active(7610)
    act.connect(ConnParam())
    ev = expect(v4.event_channel, RDMA_CM_EVENT_CONNECT_REQUEST)
    child = CMID(creator=ev, listen_id=v4)
    child.create_qp(qp_init(RDMA_PS_TCP))
    child.accept(ConnParam())
    expect(ach, RDMA_CM_EVENT_ESTABLISHED)


def test_wildcard_ipv6_without_afonly(sim: Simulation) -> None:
    if bindv6only():
        pytest.skip("net.ipv6.bindv6only is 1 here: every IPv6 bind is AFONLY")
    _, v4 = _id()
    _bind(v4, "0.0.0.0", 7620)
    _, v6 = _id()
    assert _errno(_bind, v6, "::", 7620) == errno.EADDRNOTAVAIL
    # alone, it takes IPv4 requests too
    _, dual = _id()
    _bind(dual, "::", 7621)
    dual.listen()
    _ach, act = active(7621)
    act.connect(ConnParam())
    expect(dual.event_channel, RDMA_CM_EVENT_CONNECT_REQUEST)


def test_afonly_ipv6_listener_refuses_ipv4(sim: Simulation) -> None:
    _, v6 = _id(afonly=1)
    _bind(v6, "::", 7630)
    v6.listen()
    ach, act = active(7630)
    act.connect(ConnParam())
    expect(ach, RDMA_CM_EVENT_REJECTED)


def test_option_sizes_levels_and_names(sim: Simulation) -> None:
    _, cid = _id()
    cid.set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, 32, 1)
    cid.set_option(RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, 18, 1)
    for name, wrong in ((RDMA_OPTION_ID_TOS, 4), (RDMA_OPTION_ID_ACK_TIMEOUT, 4),
                        (RDMA_OPTION_ID_REUSEADDR, 1), (RDMA_OPTION_ID_AFONLY, 2)):  # fmt: skip
        assert _errno(cid.set_option, RDMA_OPTION_ID, name, 1, wrong) == errno.EINVAL
    assert _errno(cid.set_option, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, 1, 1) == errno.ENOSYS
