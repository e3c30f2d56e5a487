"""fio's rdma engine (Debian fio 3.33): RDMA WRITE, RDMA READ and SEND, as a
pair on one host.

The receiver (no ``hostname``) registers its buffers and waits; the sender
(``hostname=127.0.0.1``) moves ``size`` bytes in ``bs`` blocks with the
``verb`` asked.  Verdict: both jobs end with ``err= 0`` and the sender's
group line counts every byte (``io=4096KiB``).  fio's rdma engine offers no
data check across the two processes (``verify`` reads back through the
engine, which the rdma engine does not do), so the data are not checked here.
"""

from __future__ import annotations

import re

import pytest
from pair_kit import Server, free_port, need, on_softverbs, run, sv_env

SIZE_KIB = 4096


@pytest.mark.parametrize("verb", ["write", "read", "send"])
def test_fio_rdma_engine(host_service: str, verb: str) -> None:
    fio = need("fio", "fio")
    env = sv_env(host_service)
    port = free_port()
    common = ["--ioengine=rdma", f"--port={port}", "--bs=64k", f"--size={SIZE_KIB}k"]
    server = Server(on_softverbs(fio, "--name=receiver", *common, "--rw=read", "--iodepth=4"),
                    env)  # fmt: skip
    try:
        server.wait_for(lambda: "waiting for connection" in server.output(), "fio waiting")
        client = run(on_softverbs(fio, "--name=sender", *common, "--hostname=127.0.0.1",
                                  f"--verb={verb}", "--rw=write", "--iodepth=1"), env)  # fmt: skip
    finally:
        srv = server.finish(60)
    assert client.code == 0 and "err= 0" in client.out, str(client)
    assert srv.code == 0 and "err= 0" in srv.out, str(srv)
    m = re.search(r"WRITE: bw=(\S+) .*io=(\d+)KiB", client.out)
    assert m and int(m.group(2)) == SIZE_KIB, str(client)
    print(f"fio rdma {verb}: {m.group(1)}")
