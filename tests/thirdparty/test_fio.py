"""fio's rdma engine (Debian fio 3.33): RDMA WRITE, RDMA READ and SEND, as a
pair on one host.

The receiver (no ``hostname``) registers its buffers and waits; the sender
(``hostname=127.0.0.1``) moves ``size`` bytes in ``bs`` blocks with the
``verb`` asked.  Verdict: both jobs end with ``err= 0`` and the sender's
group line counts every byte (``io=4096KiB``).  fio's rdma engine offers no
data check across the two processes (``verify`` reads back through the
engine, which the rdma engine does not do), so the data are not checked here.

SEND and fio's RNR hang (docs/status.md).  fio's engine connects with an
``rdma_conn_param`` it zeroes and sets only ``retry_count`` in, so its QPs get
``rnr_retry`` 0, as the kernel's rdma_cm gives them: a SEND that finds no
receive posted is not retried but completes with IBV_WC_RNR_RETRY_EXC_ERR,
the IB rule rxe follows too.  fio's ``getevents`` then takes that error
completion for "no event yet" (``cq_event_handler`` returns -1, and ``if (ret
< 1) goto again``) and waits for a completion event that never comes: the
sender hangs, and the receiver with it.  A receiver that posts again one
receive per completion (``iodepth=4``) falls behind a sender with one SEND in
flight whenever it is not scheduled for four SENDs in a row, which a loaded
two-core machine does about once in 12-15 runs.  So the SEND receiver is given
a depth of one receive per block (``SIZE_KIB / BS_KIB``): it posts them all
during the half second fio's sender sleeps before its first SEND for this
reason (engines/rdma.c, fio_rdmaio_connect), and a SEND cannot find the
receive queue empty unless the receiver is that half second late.  Should it
be, the run ends at the sender's RNR error (not after the timeout) and is made
again, up to ATTEMPTS runs in all, when -- and only when -- that is what ended
it.
"""

from __future__ import annotations

import re
import time

import pytest
from pair_kit import TIMEOUT, Run, Server, free_port, need, on_softverbs, sv_env

SIZE_KIB = 4096
BS_KIB = 64
#: what fio's sender prints for an RNR NAK its rnr_retry of 0 does not retry; it then hangs
RNR = "RNR retry counter exceeded"
ATTEMPTS = 3


def fio_pair(fio: str, env: dict[str, str], verb: str) -> tuple[Run, Run]:
    """Sender and receiver, each to its end (stopped, and said so, if the sender
    hangs: at an RNR error, or after TIMEOUT)."""
    port = free_port()
    common = ["--ioengine=rdma", f"--port={port}", f"--bs={BS_KIB}k", f"--size={SIZE_KIB}k"]
    depth = SIZE_KIB // BS_KIB if verb == "send" else 4
    server = Server(on_softverbs(fio, "--name=receiver", *common, "--rw=read",
                                 f"--iodepth={depth}"), env)  # fmt: skip
    try:
        server.wait_for(lambda: "waiting for connection" in server.output(), "fio waiting")
        sender = ["--name=sender", *common, "--hostname=127.0.0.1", f"--verb={verb}",
                  "--rw=write", "--iodepth=1"]  # fmt: skip
        client = Server(on_softverbs(fio, *sender), env)
        try:
            end = time.monotonic() + TIMEOUT
            while client.proc.poll() is None and RNR not in client.output():
                if time.monotonic() > end:
                    break
                time.sleep(0.05)
            hung = client.proc.poll() is None
            why = "an RNR error" if RNR in client.output() else f"no end after {TIMEOUT:.0f} s"
            cli = client.stop(f"[test: killed at {why}: a hang]" if hung else "", kill=hung)
        finally:
            client.stop()
    except BaseException:
        server.stop()
        raise
    srv = server.stop("[test: killed with the sender]", kill=True) if hung else server.finish(60)
    return cli, srv


@pytest.mark.parametrize("verb", ["write", "read", "send"])
def test_fio_rdma_engine(host_service: str, verb: str) -> None:
    fio = need("fio", "fio")
    env = sv_env(host_service)
    for attempt in range(ATTEMPTS):
        client, srv = fio_pair(fio, env, verb)
        if RNR not in client.out or attempt == ATTEMPTS - 1:
            break
        print(f"attempt {attempt + 1}: fio's sender hung at an RNR error ({RNR}), again")
    assert client.code == 0 and "err= 0" in client.out, str(client)
    assert srv.code == 0 and "err= 0" in srv.out, str(srv)
    m = re.search(r"WRITE: bw=(\S+) .*io=(\d+)KiB", client.out)
    assert m and int(m.group(2)) == SIZE_KIB, str(client)
    print(f"fio rdma {verb}: {m.group(1)}")
