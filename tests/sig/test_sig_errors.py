"""Bad input to the signature extension: EINVAL (or EOPNOTSUPP), and nothing changes.

* cancel on a QP without pipelining, or outside SQD;
* an mkey used after it was invalidated (or before it was configured);
* a block size or signature type that is not supported;
* a layout longer than the mkey's ``max_entries``;

and the opt-in: without it, nothing claims to be mlx5.
"""

from __future__ import annotations

import errno
import importlib
import subprocess
import sys

import pytest
from sig_kit import (
    MASK_CRC32,
    PLAIN_MKEY,
    RW,
    SIG_MKEY,
    Pair,
    configure,
    crc_domain,
    engine_xform,
    make_pair,
    poll_n,
    response_wr,
    t10_domain,
    write_wr,
)

from softverbs import PD, SGE, Context, PyverbsRDMAError, PyverbsUserError, QPAttr, RecvWR, SendWR
from softverbs.compat.vendor_dv.mlx5_enums import (
    mlx5dv_block_size,
    mlx5dv_context_attr_flags,
    mlx5dv_mkey_init_attr_flags,
    mlx5dv_sig_crc_type,
    mlx5dv_sig_t10dif_bg_type,
)
from softverbs.enums import (
    IBV_QP_STATE,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_SEND_INLINE,
    IBV_SEND_SIGNALED,
    IBV_WC_SUCCESS,
    IBV_WR_LOCAL_INV,
)
from softverbs.ext import mlx5dv as dv
from softverbs.ext.mlx5dv import (
    Mlx5Context,
    Mlx5DVContextAttr,
    Mlx5Mkey,
    Mlx5MkeyConfAttr,
    Mlx5MrInterleaved,
    Mlx5SigBlockAttr,
    qp_cancel_posted_send_wrs,
)


@pytest.fixture
def pair(ctx: Mlx5Context) -> Pair:
    return make_pair(ctx)


def _einval(exc: pytest.ExceptionInfo[PyverbsRDMAError], *words: str) -> None:
    assert exc.value.error_code == errno.EINVAL, exc.value
    for w in words:
        assert w in str(exc.value), (w, str(exc.value))


def _sq(pair: Pair) -> tuple[int, int]:
    sq = pair.target.qp.sq
    assert sq is not None
    return sq.pi, int(sq.hdr[sq.DB])


# --- cancel -------------------------------------------------------------------------------
def test_cancel_outside_sqd_changes_nothing(pair: Pair) -> None:
    t, i = pair.target, pair.initiator
    assert qp_cancel_posted_send_wrs(t.qp, 5) == -errno.EINVAL
    with pytest.raises(PyverbsRDMAError) as ei:
        t.qp.cancel_posted_send_wrs(5)
    _einval(ei, "RTS", "only in SQD")
    # a WR waiting in a user-requested SQD is cancellable on a pipelining QP, but not
    # once the QP is back in RTS
    t.qp.modify(QPAttr(qp_state=IBV_QPS_SQD), IBV_QP_STATE)
    i.qp.post_recv(RecvWR(1, 1, [i.sge(0, 16)]))
    t.qp.post_send(response_wr(5, t.sge(0, 16)))
    t.qp.modify(QPAttr(qp_state=IBV_QPS_RTS), IBV_QP_STATE)
    assert qp_cancel_posted_send_wrs(t.qp, 5) == -errno.EINVAL
    wc = poll_n(t.cq, 1)[0]
    assert (wc.wr_id, wc.status, wc.byte_len) == (5, IBV_WC_SUCCESS, 16)  # it really went
    assert poll_n(i.cq, 1)[0].byte_len == 16


def test_cancel_without_pipelining_changes_nothing(ctx: Mlx5Context) -> None:
    pair = make_pair(ctx, pipelining=False)
    t, i = pair.target, pair.initiator
    t.qp.modify(QPAttr(qp_state=IBV_QPS_SQD), IBV_QP_STATE)
    t.qp.post_send(response_wr(5, t.sge(0, 16)))
    before = _sq(pair)
    assert qp_cancel_posted_send_wrs(t.qp, 5) == -errno.EINVAL
    with pytest.raises(PyverbsRDMAError) as ei:
        t.qp.cancel_posted_send_wrs(5)
    _einval(ei, "SIG_PIPELINING")
    assert _sq(pair) == before and t.qp.qp_state == IBV_QPS_SQD
    i.qp.post_recv(RecvWR(1, 1, [i.sge(0, 16)]))
    t.qp.modify(QPAttr(qp_state=IBV_QPS_RTS), IBV_QP_STATE)
    assert poll_n(t.cq, 1)[0].byte_len == 16  # not cancelled


# --- mkeys that are not usable -------------------------------------------------------------
def test_mkey_used_after_invalidation(pair: Pair) -> None:
    t, i = pair.target, pair.initiator
    mkey = Mlx5Mkey(pair.pd, PLAIN_MKEY, 2)
    with pytest.raises(PyverbsRDMAError) as ei:  # never configured
        t.qp.post_send(write_wr(1, SGE(0, 8, mkey.lkey), i.mr.rkey, i.mr.buf))
    _einval(ei, "not configured")
    configure(t, mkey, [t.sge(0, 64)])
    t.qp.post_send(write_wr(2, SGE(0, 8, mkey.lkey), i.mr.rkey, i.mr.buf, flags=IBV_SEND_SIGNALED))
    assert poll_n(t.cq, 1)[0].status == IBV_WC_SUCCESS
    inv = SendWR(opcode=IBV_WR_LOCAL_INV)
    inv.imm_data = mkey.lkey
    t.qp.post_send(inv)
    assert poll_n(t.cq, 1)[0].status == IBV_WC_SUCCESS
    before = _sq(pair)
    with pytest.raises(PyverbsRDMAError) as ei:
        t.qp.post_send(write_wr(3, SGE(0, 8, mkey.lkey), i.mr.rkey, i.mr.buf))
    _einval(ei, "invalidated")
    with pytest.raises(PyverbsRDMAError) as ei:
        t.qp.post_recv(RecvWR(4, 1, [SGE(0, 8, mkey.lkey)]))
    _einval(ei, "invalidated")
    assert _sq(pair) == before and t.qp.qp_state == IBV_QPS_RTS
    # configured again, it works again -- even in the same batch as its use
    t.qp.wr_start()
    t.qp.wr_flags = IBV_SEND_INLINE
    t.qp.wr_mkey_configure(mkey, 2, Mlx5MkeyConfAttr())
    t.qp.wr_set_mkey_access_flags(RW)
    t.qp.wr_set_mkey_layout_list([t.sge(0, 64)])
    t.qp.wr_flags = IBV_SEND_SIGNALED
    t.qp.wr_rdma_write(i.mr.rkey, i.mr.buf)
    t.qp.wr_set_sge(SGE(0, 8, mkey.lkey))
    t.qp.wr_complete()
    assert poll_n(t.cq, 1)[0].status == IBV_WC_SUCCESS


# --- unsupported configurations --------------------------------------------------------------
def _configure_sig(pair: Pair, mkey: Mlx5Mkey, attr: Mlx5SigBlockAttr) -> None:
    t = pair.target
    t.qp.wr_start()
    t.qp.wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE
    t.qp.wr_mkey_configure(mkey, 3, Mlx5MkeyConfAttr())
    t.qp.wr_set_mkey_access_flags(RW)
    t.qp.wr_set_mkey_layout_list([t.sge(0, 1032)])
    t.qp.wr_set_mkey_sig_block(attr)
    t.qp.wr_complete()


@pytest.mark.parametrize(
    ("attr", "words"),
    [
        (
            Mlx5SigBlockAttr(
                mem=crc_domain(block_size=mlx5dv_block_size.MLX5DV_BLOCK_SIZE_520),
                check_mask=MASK_CRC32,
            ),
            ["BLOCK_SIZE_520", "not supported"],
        ),
        (
            Mlx5SigBlockAttr(wire=t10_domain(block_size=mlx5dv_block_size.MLX5DV_BLOCK_SIZE_4160)),
            ["BLOCK_SIZE_4160"],
        ),
        (
            Mlx5SigBlockAttr(mem=crc_domain(mlx5dv_sig_crc_type.MLX5DV_SIG_CRC_TYPE_CRC64_XP10)),
            ["CRC64_XP10", "not supported"],
        ),
        (
            Mlx5SigBlockAttr(
                wire=t10_domain(bg_type=mlx5dv_sig_t10dif_bg_type.MLX5DV_SIG_T10DIF_CSUM)
            ),
            ["CSUM", "not supported"],
        ),
        (Mlx5SigBlockAttr(mem=crc_domain(seed=7)), ["seed"]),
        (Mlx5SigBlockAttr(), ["memory domain, a wire domain or both"]),
        (Mlx5SigBlockAttr(mem=crc_domain(), wire=t10_domain(), flags=1), ["COPY_MASK"]),
    ],
)
def test_unsupported_signatures(pair: Pair, attr: Mlx5SigBlockAttr, words: list[str]) -> None:
    mkey = Mlx5Mkey(pair.pd, SIG_MKEY, 4)
    dom = crc_domain()
    good = Mlx5SigBlockAttr(mem=dom, check_mask=MASK_CRC32)
    configure(pair.target, mkey, [pair.target.sge(0, 1032)], RW, good)
    before = _sq(pair)
    with pytest.raises(PyverbsRDMAError) as ei:
        _configure_sig(pair, mkey, attr)
    _einval(ei, *words)
    assert _sq(pair) == before  # nothing was posted
    xkey = engine_xform(mkey)
    if xkey is not None:  # in this process: the old configuration stays
        assert xkey.sig is not None and xkey.sig.mem is not None
        assert xkey.sig.mem.block_size == 512


def test_layout_longer_than_max_entries(pair: Pair) -> None:
    t = pair.target
    mkey = Mlx5Mkey(pair.pd, PLAIN_MKEY, 2)
    before = _sq(pair)
    t.qp.wr_start()
    t.qp.wr_flags = IBV_SEND_INLINE
    t.qp.wr_mkey_configure(mkey, 1, Mlx5MkeyConfAttr())
    t.qp.wr_set_mkey_layout_list([t.sge(0, 8), t.sge(64, 8), t.sge(128, 8)])
    with pytest.raises(PyverbsRDMAError) as ei:
        t.qp.wr_complete()
    _einval(ei, "3 entries exceed", "max_entries=2")
    # interleaved: one entry holds the repeat header
    t.qp.wr_start()
    t.qp.wr_flags = IBV_SEND_INLINE
    t.qp.wr_mkey_configure(mkey, 1, Mlx5MkeyConfAttr())
    t.qp.wr_set_mkey_layout_interleaved(2, [Mlx5MrInterleaved(t.mr.buf, 8, 0, t.mr.lkey)] * 2)
    with pytest.raises(PyverbsRDMAError) as ei:
        t.qp.wr_complete()
    _einval(ei, "max_entries - 1 = 1")
    assert _sq(pair) == before and not mkey.posted_valid
    xkey = engine_xform(mkey)
    assert xkey is None or xkey.layout is None


def test_malformed_configure_wrs(pair: Pair) -> None:
    t = pair.target
    plain = Mlx5Mkey(pair.pd, PLAIN_MKEY, 2)
    before = _sq(pair)
    cases = [
        # (num_setters, setters to call, flags, words)
        (3, ["access", "layout"], IBV_SEND_INLINE, ["3 setter(s) were announced, 2 called"]),
        (2, ["access", "access"], IBV_SEND_INLINE, ["once per wr_mkey_configure"]),
        (1, ["sig"], IBV_SEND_INLINE, ["BLOCK_SIGNATURE"]),
    ]
    for num, setters, flags, words in cases:
        t.qp.wr_start()
        t.qp.wr_flags = flags
        t.qp.wr_mkey_configure(plain, num, Mlx5MkeyConfAttr())
        for s in setters:
            if s == "access":
                t.qp.wr_set_mkey_access_flags(RW)
            elif s == "layout":
                t.qp.wr_set_mkey_layout_list([t.sge(0, 8)])
            else:
                t.qp.wr_set_mkey_sig_block(Mlx5SigBlockAttr(mem=crc_domain()))
        with pytest.raises(PyverbsRDMAError) as ei:
            t.qp.wr_complete()
        _einval(ei, *words)
    # mlx5 carries the configuration inline: without IBV_SEND_INLINE, EOPNOTSUPP
    t.qp.wr_start()
    t.qp.wr_flags = 0
    t.qp.wr_mkey_configure(plain, 0, Mlx5MkeyConfAttr())
    with pytest.raises(PyverbsRDMAError) as ei:
        t.qp.wr_complete()
    assert ei.value.error_code == errno.EOPNOTSUPP
    with pytest.raises(PyverbsRDMAError) as ei:  # a setter with no configure WR open
        t.qp.wr_set_mkey_access_flags(RW)
    _einval(ei, "must follow wr_mkey_configure")
    assert _sq(pair) == before


# --- what is not offered ---------------------------------------------------------------------
def test_other_mlx5_features_are_eopnotsupp(ctx: Mlx5Context, pair: Pair) -> None:
    f = mlx5dv_mkey_init_attr_flags
    for flags in (
        f.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | f.MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO,
        f.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | f.MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE,
    ):
        with pytest.raises(PyverbsRDMAError) as ei:
            Mlx5Mkey(pair.pd, flags, 2)
        assert ei.value.error_code == errno.EOPNOTSUPP
    with pytest.raises(PyverbsRDMAError) as ei:
        Mlx5Mkey(pair.pd, SIG_MKEY & ~f.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 2)
    assert ei.value.error_code == errno.EINVAL
    for call in (
        ctx.query_mlx5_device,
        ctx.devx_general_cmd,
        pair.target.qp.wr_mr_list,
        pair.target.qp.wr_memcpy,
    ):
        with pytest.raises(PyverbsRDMAError) as ei:
            call()
        assert ei.value.error_code == errno.EOPNOTSUPP
    devx = Mlx5DVContextAttr(mlx5dv_context_attr_flags.MLX5DV_CONTEXT_FLAGS_DEVX)
    with pytest.raises(PyverbsRDMAError) as ei:
        Mlx5Context(devx, name="sv0", features="sig")
    assert ei.value.error_code == errno.EOPNOTSUPP
    # mkey_check needs a signature mkey
    with pytest.raises(PyverbsRDMAError) as ei:
        Mlx5Mkey(pair.pd, PLAIN_MKEY, 1).mkey_check()
    assert ei.value.error_code == errno.EINVAL


def test_without_the_opt_in_nothing_is_mlx5(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dv.FEATURE_ENV, raising=False)
    with pytest.raises(PyverbsUserError, match="This is not an MLX5 device"):
        Mlx5Context(Mlx5DVContextAttr(), name="sv0")
    with pytest.raises(PyverbsUserError, match="unknown feature"):
        Mlx5Context(Mlx5DVContextAttr(), name="sv0", features="dc")
    with Context(name="sv0") as plain:
        pd = PD(plain)
        with pytest.raises(PyverbsRDMAError) as ei:
            Mlx5Mkey(pd, SIG_MKEY, 2)
        assert ei.value.error_code == errno.EOPNOTSUPP
    assert dv.pyverbs_names("mlx5dv") == {}
    monkeypatch.setenv(dv.FEATURE_ENV, "sig")
    assert dv.pyverbs_names("mlx5dv_mkey")["Mlx5Mkey"] is Mlx5Mkey
    with Mlx5Context(Mlx5DVContextAttr(), name="sv0") as c:  # the environment opts in
        assert c.mlx5_features == {"sig"}


@pytest.mark.parametrize("opt_in", [False, True])
def test_pyverbs_providers_mlx5_follows_the_opt_in(opt_in: bool) -> None:
    """Under ``softverbs exec`` the compat tree re-exports the extension only when asked."""
    code = (
        "from pyverbs.providers.mlx5.mlx5dv import Mlx5Context, Mlx5DVContextAttr\n"
        "from pyverbs.providers.mlx5.mlx5dv_mkey import Mlx5Mkey\n"
        "import softverbs.ext.mlx5dv as dv\n"
        "print(Mlx5Mkey is dv.Mlx5Mkey)\n"
        "try:\n"
        "    Mlx5Context(Mlx5DVContextAttr(), name='sv0').close(); print('opened')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    from softverbs.cli.exec_ import child_env

    env = child_env({k: v for k, v in __import__("os").environ.items() if k != dv.FEATURE_ENV})
    if opt_in:
        env[dv.FEATURE_ENV] = "sig"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split("\n")
    if opt_in:
        assert out[:2] == ["True", "opened"]
    else:
        assert out[0] == "False" and "This is not an MLX5 device" in out[1]
    importlib.invalidate_caches()
