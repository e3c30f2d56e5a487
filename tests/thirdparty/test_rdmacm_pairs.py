"""rdmacm-utils pairs (Debian rdma-core 44): cmtime, rdma_xserver/rdma_xclient.

* cmtime times each RDMA CM step over many connections (create id, resolve
  addr and route, create qp, connect, disconnect, destroy).  Verdict: its
  table has every step, with a figure per connection.
* rdma_xserver/rdma_xclient, in their default RC mode, use librdmacm's
  synchronous endpoints: rdma_create_ep with QP attributes (librdmacm makes
  the CQs), rdma_get_request, rdma_reg_msgs on the ID's PD, an inline SEND
  of 16 bytes on a QP that asked for max_inline_data 0 (the device's inline
  capacity covers its SGE list, as on rxe), rdma_get_recv_comp.  Verdict:
  both print ``end 0``.  Their XRC mode (``-c x``) asks for RDMA_PS_IB, a
  port space softverbs' RDMA CM does not have: EPROTONOSUPPORT, said here.
"""

from __future__ import annotations

import re

from pair_kit import Server, free_port, need, on_softverbs, run, run_when_listening, sv_env

CMTIME_STEPS = ("create id", "resolve addr", "resolve route", "create qp", "connect",
                "disconnect", "destroy")  # fmt: skip


def _rdma_cm_port() -> int:
    # the RDMA CM's port space is not TCP's; a free TCP port is as good a guess as any
    return free_port()


def test_cmtime(host_service: str) -> None:
    cmtime = need("cmtime", "rdmacm-utils")
    env = sv_env(host_service)
    port = str(_rdma_cm_port())
    server = Server(on_softverbs(cmtime, "-b", "127.0.0.1", "-p", port), env)
    try:
        client = run_when_listening(on_softverbs(cmtime, "-s", "127.0.0.1", "-p", port, "-c",
                                                 "20"), env, server,
                                    lambda r: "RDMA_CM_EVENT_REJECTED" in r.out)  # fmt: skip
    finally:
        srv = server.stop()
    # cmtime exits 0 whatever happened: its event lines say what failed
    assert client.code == 0 and "event:" not in client.out, f"client: {client}\nserver: {srv}"
    for step in CMTIME_STEPS:
        m = re.search(rf"^{step}\s*:\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", client.out,
                      re.MULTILINE)  # fmt: skip
        assert m, f"no {step!r} line: {client}"
    print(client.out)


def test_rdma_xserver_xclient_rc(host_service: str) -> None:
    xserver = need("rdma_xserver", "rdmacm-utils")
    xclient = need("rdma_xclient", "rdmacm-utils")
    env = sv_env(host_service)
    port = str(_rdma_cm_port())
    server = Server(on_softverbs(xserver, "-p", port), env)
    try:
        client = run_when_listening(on_softverbs(xclient, "-s", "127.0.0.1", "-p", port), env,
                                    server, lambda r: "Connection refused" in r.out)  # fmt: skip
    finally:
        srv = server.finish(30)
    assert client.code == 0 and "rdma_xclient: end 0" in client.out, str(client)
    assert srv.code == 0 and "rdma_xserver: end 0" in srv.out, str(srv)


def test_rdma_xclient_xrc_is_refused_clearly(host_service: str) -> None:
    xclient = need("rdma_xclient", "rdmacm-utils")
    client = run(on_softverbs(xclient, "-c", "x", "-s", "127.0.0.1", "-p",
                              str(_rdma_cm_port())), sv_env(host_service))  # fmt: skip
    assert client.code != 0 and "Protocol not supported" in client.out, str(client)

