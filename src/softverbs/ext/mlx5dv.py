"""mlx5 direct verbs' signature offload, in software: an opt-in extension.

ConnectX NICs can check and generate per-block data signatures while data
moves (T10-DIF, CRC32, CRC32C), and can stop a send queue when a check fails
so that a storage target may post a transfer and its good response together
(signature pipelining, seed 004).  This module offers that subset of
``mlx5dv``, with the names and shapes of pyverbs' ``pyverbs.providers.mlx5``:

* :class:`Mlx5Context` -- opening it is the opt-in;
* :class:`Mlx5Mkey` -- an indirect memory key with optional block signature
  support, and ``mkey_check()``;
* :class:`Mlx5QP` -- an RC extended QP with ``wr_mkey_configure`` and its
  setters (``wr_set_mkey_access_flags``, ``wr_set_mkey_layout_list``,
  ``wr_set_mkey_layout_interleaved``, ``wr_set_mkey_sig_block``), the
  ``MLX5DV_QP_CREATE_SIG_PIPELINING`` flag and ``cancel_posted_send_wrs``;
* the attribute classes (``Mlx5SigCrc``, ``Mlx5SigT10Dif``,
  ``Mlx5SigBlockDomain``, ``Mlx5SigBlockAttr``, ``Mlx5MkeyConfAttr``,
  ``Mlx5MrInterleaved``, ``Mlx5MkeyErr``, ``Mlx5SigErr``).

Opting in
---------
Nothing claims to be mlx5 unless the program asks: ``Mlx5Context(attr,
name="sv0")`` raises ``PyverbsUserError("This is not an MLX5 device")``, as
pyverbs does on other hardware, unless the signature feature is enabled --
by the environment (``SOFTVERBS_MLX5=sig``, which is how ``softverbs exec``
runs unchanged pyverbs programs) or by the program
(``Mlx5Context(attr, name="sv0", features="sig")``).  Everything else of
mlx5 (DevX, DC, steering, crypto, ``wr_mr_list`` ...) raises EOPNOTSUPP.

How it maps onto softverbs
--------------------------
An mkey is a :class:`~softverbs.engine.memory.MemKind` ``MKEY`` key whose
transform is an :class:`~softverbs.engine.signature.IndirectKey`; a
configuration is a driver WQE executed in send-queue order, as mlx5's UMR
WQE is.  Signature errors never fail a completion: they are kept on the
mkey for ``mkey_check()``.  On a SIG_PIPELINING QP the requester moves
itself to SQD, at the latest before the next WQE carrying
``IBV_SEND_FENCE``, and posts ``IBV_EVENT_SQ_DRAINED`` once the started WQEs
are done (:mod:`softverbs.engine.requester`).

Where softverbs is stricter or simpler than mlx5 (each is EINVAL or
EOPNOTSUPP, and nothing changes): block sizes 512 and 4096 only; CRC32,
CRC32C and T10-DIF with the CRC guard only; a layout longer than the mkey's
``max_entries`` (``max_entries - 1`` for an interleaved layout) is EINVAL;
using an mkey that was invalidated, or never configured, in a posted WR is
EINVAL at post time; ``cancel_posted_send_wrs`` on a QP without
SIG_PIPELINING is EINVAL.  It works on every kind of device, the host device
softverbsd serves included (docs/signature.md); C programs get the same through
softverbs' ``libmlx5.so.1``.
"""

from __future__ import annotations

import errno
import os
import weakref
from dataclasses import dataclass, field
from typing import Any

from softverbs.compat.vendor_dv.mlx5_enums import (
    mlx5dv_block_size,
    mlx5dv_context_attr_flags,
    mlx5dv_mkey_err_type,
    mlx5dv_mkey_init_attr_flags,
    mlx5dv_qp_create_flags,
    mlx5dv_qp_create_send_ops_flags,
    mlx5dv_qp_init_attr_mask,
    mlx5dv_sig_block_attr_flags,
    mlx5dv_sig_crc_type,
    mlx5dv_sig_t10dif_bg_type,
    mlx5dv_sig_t10dif_flags,
    mlx5dv_sig_type,
    mlx5dv_wc_opcode,
)
from softverbs.device import ops, records
from softverbs.engine.rings import WR_DRIVER1, SendWQE
from softverbs.engine.signature import (
    Escape,
    SigBlock,
    SigDomain,
    SigKind,
    auto_copy_mask,
    protect,
    same_structure,
)
from softverbs.enums import (
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_QPS_ERR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    IBV_QPT_RC,
    IBV_SEND_FENCE,
    IBV_SEND_INLINE,
    IBV_SEND_SIGNALED,
    IBV_SEND_SOLICITED,
    IBV_WR_LOCAL_INV,
    ibv_qp_state,
)
from softverbs.errors import PyverbsRDMAError, PyverbsUserError, einval, enomem, eopnotsupp
from softverbs.verbs.base import PyverbsCM, PyverbsObject, require
from softverbs.verbs.device import Context
from softverbs.verbs.pd import PD
from softverbs.verbs.provider import destroy
from softverbs.verbs.qp import QPEx, QPInitAttrEx
from softverbs.verbs.wr import SGE, RecvWR, SendWR

#: The environment opt-in: a comma-separated list of features.
FEATURE_ENV = "SOFTVERBS_MLX5"
#: Features this module can enable.
FEATURES = frozenset({"sig"})

#: ``MLX5DV_MKEY_CONF_FLAG_RESET_SIG_ATTR`` (mlx5dv.h; pyverbs does not export it).
MLX5DV_MKEY_CONF_FLAG_RESET_SIG_ATTR = 1 << 0
#: WC opcode of a completed mkey configuration (IBV_WC_DRIVER1).
MLX5DV_WC_UMR = int(mlx5dv_wc_opcode.MLX5DV_WC_UMR)

_MKEY_FLAGS = mlx5dv_mkey_init_attr_flags
_QP_FLAGS = mlx5dv_qp_create_flags
_SEND_OPS = mlx5dv_qp_create_send_ops_flags
_SUPPORTED_MKEY_FLAGS = _MKEY_FLAGS.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | (
    _MKEY_FLAGS.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE
)
_SUPPORTED_QP_FLAGS = (
    _QP_FLAGS.MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE | _QP_FLAGS.MLX5DV_QP_CREATE_SIG_PIPELINING
)
_SUPPORTED_SEND_OPS = int(_SEND_OPS.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)
_MKEY_ACCESS = (
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC
)  # fmt: skip
_BLOCK_SIZES = {
    mlx5dv_block_size.MLX5DV_BLOCK_SIZE_512: 512,
    mlx5dv_block_size.MLX5DV_BLOCK_SIZE_4096: 4096,
}
_CRC_KINDS = {
    mlx5dv_sig_crc_type.MLX5DV_SIG_CRC_TYPE_CRC32: SigKind.CRC32,
    mlx5dv_sig_crc_type.MLX5DV_SIG_CRC_TYPE_CRC32C: SigKind.CRC32C,
}
_T10_FLAGS = (
    mlx5dv_sig_t10dif_flags.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP
    | mlx5dv_sig_t10dif_flags.MLX5DV_SIG_T10DIF_FLAG_APP_ESCAPE
    | mlx5dv_sig_t10dif_flags.MLX5DV_SIG_T10DIF_FLAG_APP_REF_ESCAPE
)
_POST_STATES = (IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE, IBV_QPS_ERR)


def parse_features(text: str | None) -> frozenset[str]:
    """The features named in ``text`` (``SOFTVERBS_MLX5`` syntax: ``sig``, comma-separated).

    An unknown name raises PyverbsUserError, so a typo is not silently ignored."""
    names = frozenset(n.strip().lower() for n in (text or "").split(",") if n.strip())
    unknown = names - FEATURES
    if unknown:
        raise PyverbsUserError(
            f"{FEATURE_ENV}: unknown feature(s) {', '.join(sorted(unknown))}; softverbs offers "
            f"only {', '.join(sorted(FEATURES))} (mlx5 signature offload)"
        )
    return names


def opted_in() -> bool:
    """Whether the environment enables the signature feature (``SOFTVERBS_MLX5=sig``)."""
    try:
        return "sig" in parse_features(os.environ.get(FEATURE_ENV))
    except PyverbsUserError:
        return False


# --- contexts ----------------------------------------------------------------------------


class Mlx5DVContextAttr(PyverbsObject):
    """``mlx5dv_context_attr``: ``Mlx5DVContextAttr(flags=0, comp_mask=0, fds=None)``."""

    def __init__(self, flags: int = 0, comp_mask: int = 0, fds: Any = None) -> None:
        super().__init__()
        self.flags = flags
        self.comp_mask = comp_mask
        self.fds = fds

    def __str__(self) -> str:
        f = "{:20}: {:<20}\n"
        return f.format("flags", self.flags) + f.format("comp_mask", self.comp_mask)


def _unsupported(name: str) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise eopnotsupp(f"{name}: softverbs offers only mlx5's signature offload "
                         "(mkeys, signature pipelining, cancel_posted_send_wrs)")  # fmt: skip

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"pyverbs' ``{name}``: EOPNOTSUPP (not part of softverbs' mlx5 subset)."
    return method


class Mlx5Context(Context):
    """An mlx5 context: ``Mlx5Context(Mlx5DVContextAttr(), name='sv0')``.

    Opening it is the opt-in to the signature subset (module docstring):
    ``features`` (default: ``$SOFTVERBS_MLX5``) must name ``sig``, or this
    raises ``PyverbsUserError('This is not an MLX5 device')`` like pyverbs on
    another vendor's device.  DevX (``MLX5DV_CONTEXT_FLAGS_DEVX``) is EOPNOTSUPP.
    """

    def __init__(
        self, attr: Mlx5DVContextAttr, name: str = "", *, features: str | None = None
    ) -> None:
        feats = parse_features(os.environ.get(FEATURE_ENV) if features is None else features)
        if "sig" not in feats:
            raise PyverbsUserError(
                "This is not an MLX5 device (softverbs offers mlx5 signature offload only when "
                f"asked: set {FEATURE_ENV}=sig, or pass features='sig')"
            )
        require(attr, Mlx5DVContextAttr, "attr")
        if attr.flags & mlx5dv_context_attr_flags.MLX5DV_CONTEXT_FLAGS_DEVX or attr.comp_mask:
            raise eopnotsupp("Failed to open mlx5 context: DevX and mlx5dv_context_attr "
                             "comp_mask are not offered by softverbs")  # fmt: skip
        super().__init__(name=name)
        self.mlx5_features = feats
        #: the mkeys of this context by key, for post-time checks
        self.mkeys: weakref.WeakValueDictionary[int, Mlx5Mkey] = weakref.WeakValueDictionary()

    query_mlx5_device = _unsupported("query_mlx5_device")
    query_mlx5_port = _unsupported("query_mlx5_port")
    reserved_qpn_alloc = _unsupported("reserved_qpn_alloc")
    reserved_qpn_dealloc = _unsupported("reserved_qpn_dealloc")
    crypto_login = _unsupported("crypto_login")
    query_login_state = _unsupported("query_login_state")
    crypto_logout = _unsupported("crypto_logout")
    devx_general_cmd = _unsupported("devx_general_cmd")
    device_timestamp_to_ns = _unsupported("device_timestamp_to_ns")
    devx_query_eqn = _unsupported("devx_query_eqn")
    get_data_direct_sysfs_path = _unsupported("get_data_direct_sysfs_path")


def _mlx5_context(ctx: object, what: str) -> Mlx5Context:
    if not isinstance(ctx, Mlx5Context):
        raise eopnotsupp(f"{what} needs an Mlx5Context (opened with the {FEATURE_ENV}=sig "
                         "opt-in); softverbs is not an mlx5 device otherwise")  # fmt: skip
    ctx._check_open()
    return ctx


# --- signature attributes -----------------------------------------------------------------


class Mlx5SigCrc(PyverbsObject):
    """``mlx5dv_sig_crc``: ``Mlx5SigCrc(crc_type=CRC32, seed=0)``."""

    def __init__(self, crc_type: int = 0, seed: int = 0) -> None:
        super().__init__()
        self.crc_type = crc_type
        self.seed = seed


class Mlx5SigT10Dif(PyverbsObject):
    """``mlx5dv_sig_t10dif``: guard type and seed, application and reference tags, flags."""

    def __init__(self, bg_type: int = 0, bg: int = 0, app_tag: int = 0, ref_tag: int = 0,
                 flags: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.bg_type = bg_type
        self.bg = bg
        self.app_tag = app_tag
        self.ref_tag = ref_tag
        self.flags = flags


class Mlx5SigBlockDomain(PyverbsObject):
    """``mlx5dv_sig_block_domain``: one domain's signature type, parameters and block size."""

    def __init__(self, sig_type: int = 0, dif: Mlx5SigT10Dif | None = None,
                 crc: Mlx5SigCrc | None = None, block_size: int = 0,
                 comp_mask: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.sig_type = sig_type
        self.dif = dif
        self.crc = crc
        self.block_size = block_size
        self.comp_mask = comp_mask


class Mlx5SigBlockAttr(PyverbsObject):
    """``mlx5dv_sig_block_attr``: memory and wire domains, check and copy masks."""

    def __init__(self, mem: Mlx5SigBlockDomain | None = None,
                 wire: Mlx5SigBlockDomain | None = None, flags: int = 0, check_mask: int = 0,
                 copy_mask: int = 0, comp_mask: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.mem = mem
        self.wire = wire
        self.flags = flags
        self.check_mask = check_mask
        self.copy_mask = copy_mask
        self.comp_mask = comp_mask


class Mlx5SigErr(PyverbsObject):
    """``mlx5dv_sig_err``: the values ``mkey_check`` reports."""

    def __init__(self, actual_value: int = 0, expected_value: int = 0, offset: int = 0) -> None:
        super().__init__()
        self._actual = actual_value
        self._expected = expected_value
        self._offset = offset

    @property
    def actual_value(self) -> int:
        """The value computed from the transferred data (or the configured tag)."""
        return self._actual

    @property
    def expected_value(self) -> int:
        """The value found in the signature field."""
        return self._expected

    @property
    def offset(self) -> int:
        """Data offset of the bad block in the mkey (a block boundary)."""
        return self._offset


class Mlx5MkeyErr(PyverbsObject):
    """``mlx5dv_mkey_err``: what ``mkey_check`` found (``err_type``, ``sig_err``)."""

    def __init__(self, sig_err: Mlx5SigErr | None = None,
                 err_type: int = mlx5dv_mkey_err_type.MLX5DV_MKEY_NO_ERR) -> None:  # fmt: skip
        super().__init__()
        self._sig_err = sig_err if sig_err is not None else Mlx5SigErr()
        self._err_type = err_type
        self.domain = ""  #: softverbs: "memory" or "wire", where the bad block was

    @property
    def err_type(self) -> int:
        return self._err_type

    @property
    def sig_err(self) -> Mlx5SigErr:
        return self._sig_err

    def __str__(self) -> str:
        try:
            name = mlx5dv_mkey_err_type(self._err_type).name
        except ValueError:
            name = str(self._err_type)
        e = self._sig_err
        if self._err_type == mlx5dv_mkey_err_type.MLX5DV_MKEY_NO_ERR:
            return name
        return (f"{name}: expected {e.expected_value:#x}, actual {e.actual_value:#x}, "
                f"offset {e.offset} ({self.domain} domain)")  # fmt: skip


class Mlx5MkeyConfAttr(PyverbsObject):
    """``mlx5dv_mkey_conf_attr``: ``conf_flags`` (RESET_SIG_ATTR) and ``comp_mask``."""

    def __init__(self, conf_flags: int = 0, comp_mask: int = 0) -> None:
        super().__init__()
        self.conf_flags = conf_flags
        self.comp_mask = comp_mask


class Mlx5MrInterleaved(PyverbsObject):
    """``mlx5dv_mr_interleaved``: ``bytes_count`` bytes at ``addr``, then skip ``bytes_skip``."""

    def __init__(self, addr: int, bytes_count: int, bytes_skip: int, lkey: int) -> None:
        super().__init__()
        self.addr = addr
        self.bytes_count = bytes_count
        self.bytes_skip = bytes_skip
        self.lkey = lkey


# --- mkeys ------------------------------------------------------------------------------------


class Mlx5Mkey(PyverbsCM):
    """An indirect mkey: ``Mlx5Mkey(pd, create_flags, max_entries)``.

    ``create_flags`` must have ``MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT``, and may
    have ``..._BLOCK_SIGNATURE``; the others are EOPNOTSUPP.  The mkey is
    usable once a ``wr_mkey_configure`` WR has run; ``lkey == rkey``.
    """

    close_rank = 35

    def __init__(self, pd: PD, create_flags: int, max_entries: int) -> None:
        super().__init__()
        require(pd, PD, "pd")
        pd._check_open()
        ctx = _mlx5_context(pd.ctx, "Failed to create mkey: Mlx5Mkey")
        if not create_flags & _MKEY_FLAGS.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT:
            raise einval("Failed to create mkey: create_flags must include "
                         "MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT")  # fmt: skip
        if create_flags & ~_SUPPORTED_MKEY_FLAGS:
            raise eopnotsupp(f"Failed to create mkey: create flags "
                             f"{create_flags & ~_SUPPORTED_MKEY_FLAGS:#x} are not offered "
                             "(softverbs: INDIRECT and BLOCK_SIGNATURE)")  # fmt: skip
        if not isinstance(max_entries, int) or not 1 <= max_entries <= 0xFFFF:
            raise einval(f"Failed to create mkey: max_entries={max_entries!r} is not 1..65535")
        self.pd = pd
        self._ctx = ctx
        self.create_flags = create_flags
        self._max_entries = max_entries
        sig_flag = _MKEY_FLAGS.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE
        self.signature = bool(create_flags & sig_flag)
        #: as seen by posting: configured and not invalidated by a posted WR
        self.posted_valid = False
        flags = records.MKEY_BLOCK_SIGNATURE if self.signature else 0
        req = records.CreateMkey(pd.device_pd, flags, max_entries, 0)
        reply = ctx.provider.call(ops.CREATE_MKEY, req)
        self.dev_handle: int = reply.handle
        self._keyval: int = reply.key
        ctx.mkeys[self._keyval] = self
        pd.add_ref(self)

    @property
    def lkey(self) -> int:
        return self._keyval

    @property
    def rkey(self) -> int:
        return self._keyval

    @property
    def max_entries(self) -> int:
        return self._max_entries

    def mkey_check(self) -> Mlx5MkeyErr:
        """``mlx5dv_mkey_check``: the first signature error since the last check, cleared."""
        self._check_open()
        if not self.signature:
            raise PyverbsRDMAError("Failed to check the mkey: it was not created with "
                                   "MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE",
                                   errno.EINVAL)  # fmt: skip
        err = self._ctx.provider.call(ops.MKEY_CHECK, records.Handle(self.dev_handle, 0))
        if not err.err_type:
            return Mlx5MkeyErr()
        out = Mlx5MkeyErr(Mlx5SigErr(err.actual, err.expected, err.offset), int(err.err_type))
        out.domain = "wire" if err.domain else "memory"
        return out

    def _release(self) -> None:
        destroy(self._ctx.provider, records.KIND_MKEY, self.dev_handle)
        self._ctx.mkeys.pop(self._keyval, None)

    def __str__(self) -> str:
        return f"Mlx5Mkey: lkey {self.lkey:#x}, max_entries {self._max_entries}\n"


# --- configuration WRs ----------------------------------------------------------------


@dataclass
class _MkeyConf:
    """A ``wr_mkey_configure`` WR being built (setters fill it; errors wait for wr_complete)."""

    mkey: Mlx5Mkey
    num_setters: int
    reset_sig: bool
    setters: int = 0
    access: int | None = None
    entries: list[tuple[int, int, int, int]] | None = None
    repeat: int = 1
    sig: SigBlock | None = None
    sig_set: bool = False
    error: PyverbsRDMAError | None = None
    called: set[str] = field(default_factory=set)

    def fail(self, exc: PyverbsRDMAError) -> None:
        if self.error is None:
            self.error = exc


def _domain(d: Mlx5SigBlockDomain | None, which: str) -> SigDomain | None:
    """An mlx5dv signature domain as the engine's :class:`SigDomain` (EINVAL if unsupported)."""
    if d is None:
        return None
    where = f"wr_set_mkey_sig_block: the {which} domain"
    require(d, Mlx5SigBlockDomain, which)
    if d.comp_mask:
        raise einval(f"{where} has comp_mask {d.comp_mask:#x}; it must be 0")
    size = _BLOCK_SIZES.get(d.block_size)  # type: ignore[call-overload]
    if size is None:
        raise einval(f"{where}: block size {_enum_name(mlx5dv_block_size, d.block_size)} is not "
                     "supported (softverbs: MLX5DV_BLOCK_SIZE_512 and _4096)")  # fmt: skip
    if d.sig_type == mlx5dv_sig_type.MLX5DV_SIG_TYPE_CRC:
        crc = d.crc
        if crc is None:
            raise einval(f"{where} is MLX5DV_SIG_TYPE_CRC but has no Mlx5SigCrc")
        kind = _CRC_KINDS.get(crc.crc_type)  # type: ignore[call-overload]
        if kind is None:
            raise einval(f"{where}: CRC type {_enum_name(mlx5dv_sig_crc_type, crc.crc_type)} "
                         "is not supported (softverbs: CRC32 and CRC32C)")  # fmt: skip
        if crc.seed not in (0, 0xFFFFFFFF):
            raise einval(f"{where}: CRC seed {crc.seed:#x} must be 0 or 0xFFFFFFFF")
        return SigDomain(kind, size, crc.seed)
    if d.sig_type == mlx5dv_sig_type.MLX5DV_SIG_TYPE_T10DIF:
        dif = d.dif
        if dif is None:
            raise einval(f"{where} is MLX5DV_SIG_TYPE_T10DIF but has no Mlx5SigT10Dif")
        if dif.bg_type != mlx5dv_sig_t10dif_bg_type.MLX5DV_SIG_T10DIF_CRC:
            raise einval(f"{where}: T10-DIF guard type "
                         f"{_enum_name(mlx5dv_sig_t10dif_bg_type, dif.bg_type)} is not supported "
                         "(softverbs: MLX5DV_SIG_T10DIF_CRC)")  # fmt: skip
        if dif.bg not in (0, 0xFFFF):
            raise einval(f"{where}: T10-DIF guard seed bg={dif.bg:#x} must be 0 or 0xFFFF")
        if dif.flags & ~_T10_FLAGS:
            raise einval(f"{where}: unknown T10-DIF flags {dif.flags & ~_T10_FLAGS:#x}")
        if not 0 <= dif.app_tag <= 0xFFFF or not 0 <= dif.ref_tag <= 0xFFFFFFFF:
            raise einval(f"{where}: app_tag is 16 bits and ref_tag 32 bits")
        flags = mlx5dv_sig_t10dif_flags
        if dif.flags & flags.MLX5DV_SIG_T10DIF_FLAG_APP_REF_ESCAPE:
            escape = Escape.APP_REF
        elif dif.flags & flags.MLX5DV_SIG_T10DIF_FLAG_APP_ESCAPE:
            escape = Escape.APP
        else:
            escape = Escape.NONE
        remap = bool(dif.flags & flags.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP)
        return SigDomain(SigKind.T10DIF, size, dif.bg, dif.app_tag, dif.ref_tag, remap, escape)
    raise einval(f"{where}: signature type {_enum_name(mlx5dv_sig_type, d.sig_type)} is not "
                 "supported (softverbs: MLX5DV_SIG_TYPE_CRC and _T10DIF)")  # fmt: skip


def _enum_name(enum: Any, value: Any) -> str:
    try:
        return str(enum(value).name)
    except (ValueError, TypeError):
        return repr(value)


def sig_block(attr: Mlx5SigBlockAttr) -> SigBlock:
    """Check an ``Mlx5SigBlockAttr`` and turn it into the engine's :class:`SigBlock`."""
    require(attr, Mlx5SigBlockAttr, "block_attr")
    if attr.mem is None and attr.wire is None:
        raise einval("wr_set_mkey_sig_block: give a memory domain, a wire domain or both")
    copy_flag = mlx5dv_sig_block_attr_flags.MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK
    if attr.flags & ~copy_flag:
        raise einval(f"wr_set_mkey_sig_block: unknown flags {attr.flags & ~copy_flag:#x}")
    if attr.comp_mask:
        raise einval("wr_set_mkey_sig_block: comp_mask must be 0")
    for name in ("check_mask", "copy_mask"):
        value = getattr(attr, name)
        if not isinstance(value, int) or not 0 <= value <= 0xFF:
            raise einval(f"wr_set_mkey_sig_block: {name}={value!r} is not an 8-bit mask")
    mem = _domain(attr.mem, "memory")
    wire = _domain(attr.wire, "wire")
    if attr.flags & copy_flag:
        if not same_structure(mem, wire):
            raise einval("wr_set_mkey_sig_block: MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK needs the "
                         "same signature type and block size in both domains")  # fmt: skip
        copy = attr.copy_mask
    else:
        copy = auto_copy_mask(mem, wire)
    return SigBlock(mem, wire, attr.check_mask, copy)


def sig_image(data: bytes | bytearray | memoryview, domain: Mlx5SigBlockDomain | None) -> bytes:
    """A softverbs addition: ``data`` with a valid signature after every whole
    block, as ``domain`` describes it -- the memory image a program prepares
    for a memory-domain signature, or what the wire carries for a wire one."""
    return protect(data, _domain(domain, "given"))


# --- QPs ------------------------------------------------------------------------------


class Mlx5DVQPInitAttr(PyverbsObject):
    """``mlx5dv_qp_init_attr``: ``Mlx5DVQPInitAttr(comp_mask, create_flags, dc_init_attr,
    send_ops_flags)``."""

    def __init__(self, comp_mask: int = 0, create_flags: int = 0, dc_init_attr: Any = None,
                 send_ops_flags: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.comp_mask = comp_mask
        self.create_flags = create_flags
        self.dc_init_attr = dc_init_attr
        self.send_ops_flags = send_ops_flags
        self.dc_type = getattr(dc_init_attr, "dc_type", 0)
        self.dct_access_key = getattr(dc_init_attr, "dct_access_key", 0)
        self.dci_streams = getattr(dc_init_attr, "dci_streams", None)


class Mlx5DVCQInitAttr(PyverbsObject):
    """``mlx5dv_cq_init_attr``: only held -- ``Mlx5CQ`` is EOPNOTSUPP -- but with
    pyverbs' defaults, so set-up code that adjusts it runs until the CQ is asked for."""

    def __init__(self, comp_mask: int = 0, cqe_comp_res_format: int = 0, flags: int = 0,
                 cqe_size: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.comp_mask = comp_mask
        self.cqe_comp_res_format = cqe_comp_res_format
        self.flags = flags
        self.cqe_size = cqe_size


class Mlx5QP(QPEx):
    """An mlx5 RC QP: ``Mlx5QP(ctx, QPInitAttrEx(...), Mlx5DVQPInitAttr(...))``.

    Offers ``MLX5DV_QP_EX_WITH_MKEY_CONFIGURE`` (the ``wr_mkey_configure`` WR and
    its setters) and ``MLX5DV_QP_CREATE_SIG_PIPELINING`` with
    ``cancel_posted_send_wrs``; ``MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE`` is
    accepted (softverbs never scatters to CQEs).  Anything else is EOPNOTSUPP.
    """

    def __init__(self, context: Context, init_attr: QPInitAttrEx,
                 dv_init_attr: Mlx5DVQPInitAttr | None = None) -> None:  # fmt: skip
        ctx = _mlx5_context(context, "Failed to create MLX5 QP: Mlx5QP")
        require(init_attr, QPInitAttrEx, "init_attr")
        mask = dv_init_attr.comp_mask if dv_init_attr is not None else 0
        amask = mlx5dv_qp_init_attr_mask
        known = amask.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS | (
            amask.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS
        )
        if mask & ~known:
            raise eopnotsupp(f"Failed to create MLX5 QP: comp_mask {mask & ~known:#x} (DC, DCI "
                             "streams) is not offered by softverbs")  # fmt: skip
        flags = ops = 0
        if dv_init_attr is not None:
            if mask & amask.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS:
                flags = dv_init_attr.create_flags
            if mask & amask.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS:
                ops = dv_init_attr.send_ops_flags
        if flags & ~_SUPPORTED_QP_FLAGS:
            raise eopnotsupp(f"Failed to create MLX5 QP: create flags "
                             f"{flags & ~_SUPPORTED_QP_FLAGS:#x} are not offered (softverbs: "
                             "SIG_PIPELINING, DISABLE_SCATTER_TO_CQE)")  # fmt: skip
        if ops & ~_SUPPORTED_SEND_OPS:
            raise eopnotsupp(f"Failed to create MLX5 QP: send_ops_flags "
                             f"{ops & ~_SUPPORTED_SEND_OPS:#x} are not offered (softverbs: "
                             "MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)")  # fmt: skip
        if init_attr.qp_type != IBV_QPT_RC:
            raise eopnotsupp("Failed to create MLX5 QP: softverbs' mlx5 QPs are RC QPs")
        self._dv_flags = records.DV_SIG_PIPELINING if flags & _QP_FLAGS.MLX5DV_QP_CREATE_SIG_PIPELINING else 0  # noqa: E501
        # the configuration WQEs carry the mkey's layout inline (as mlx5's UMR WQEs do):
        # room for MKEY_WQE_INLINE bytes, reported back in init_attr.cap like any rounding up
        cap = init_attr.cap.copy()
        cap.max_inline_data = max(cap.max_inline_data, MKEY_WQE_INLINE)
        init_attr.cap = cap
        super().__init__(ctx, init_attr)
        self.dv_create_flags = flags
        self.dv_send_ops_flags = ops
        self.dc_type = 0
        self._conf: _MkeyConf | None = None
        #: mkey validity changes of WRs built but not yet committed (posted)
        self._marks: list[tuple[Mlx5Mkey, bool]] = []

    @property
    def sig_pipelining(self) -> bool:
        return bool(self.dv_create_flags & _QP_FLAGS.MLX5DV_QP_CREATE_SIG_PIPELINING)

    # --- the configuration WR ---------------------------------------------------------------
    def wr_mkey_configure(self, mkey: Mlx5Mkey, num_setters: int,
                          mkey_config: Mlx5MkeyConfAttr) -> None:  # fmt: skip
        """Start a WR that configures ``mkey``; ``num_setters`` setters must follow."""
        if self._batch is None:
            raise einval("wr_mkey_configure called outside wr_start()/wr_complete()")
        require(mkey, Mlx5Mkey, "mkey")
        require(mkey_config, Mlx5MkeyConfAttr, "mkey_config")
        reset = MLX5DV_MKEY_CONF_FLAG_RESET_SIG_ATTR
        wr = SendWR.without_sges(self.wr_id, WR_DRIVER1, self.wr_flags)
        conf = _MkeyConf(mkey, num_setters, bool(mkey_config.conf_flags & reset))
        wr.mkey_conf = conf  # type: ignore[attr-defined]  # (kept in the WR's __dict__)
        self._batch.append(wr)
        self._conf = conf
        if not self._mkey_ops():
            conf.fail(einval("wr_mkey_configure: this QP was not created with "
                             "MLX5DV_QP_EX_WITH_MKEY_CONFIGURE in send_ops_flags"))  # fmt: skip
        elif not self.wr_flags & IBV_SEND_INLINE:
            conf.fail(eopnotsupp("wr_mkey_configure: set IBV_SEND_INLINE in wr_flags first "
                                 "(mlx5 carries the configuration inline)"))  # fmt: skip
        elif mkey_config.conf_flags & ~reset or mkey_config.comp_mask:
            conf.fail(eopnotsupp("wr_mkey_configure: only MLX5DV_MKEY_CONF_FLAG_RESET_SIG_ATTR "
                                 "and comp_mask 0 are supported"))  # fmt: skip
        elif mkey.closed or mkey._ctx is not self._ctx:
            conf.fail(einval("wr_mkey_configure: the mkey is closed or belongs to another "
                             "context"))  # fmt: skip
        elif mkey.pd.device_pd != (self.pd.device_pd if self.pd is not None else -1):
            conf.fail(einval("wr_mkey_configure: the mkey and the QP are in different PDs"))
        elif not isinstance(num_setters, int) or not 0 <= num_setters <= 0xFF:
            conf.fail(einval(f"wr_mkey_configure: num_setters={num_setters!r} is not 0..255"))

    def _mkey_ops(self) -> bool:
        return bool(self.dv_send_ops_flags & _SEND_OPS.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)

    def _setter(self, name: str) -> _MkeyConf:
        """The open configuration WR, counting this setter (errors are kept for later)."""
        conf = self._conf
        batch = self._batch
        last: object = getattr(batch[-1], "mkey_conf", None) if batch else None
        if conf is None or last is not conf:
            raise einval(f"{name} must follow wr_mkey_configure in the same wr_start() batch")
        conf.setters += 1
        if name in conf.called:
            conf.fail(einval(f"{name} may be called once per wr_mkey_configure"))
        elif conf.setters > conf.num_setters:
            conf.fail(einval(f"{name}: wr_mkey_configure announced {conf.num_setters} "
                             "setter(s); this is one more"))  # fmt: skip
        conf.called.add(name)
        return conf

    def wr_set_mkey_access_flags(self, access_flags: int) -> None:
        conf = self._setter("wr_set_mkey_access_flags")
        if access_flags & ~_MKEY_ACCESS:
            conf.fail(einval(f"wr_set_mkey_access_flags: flags {access_flags & ~_MKEY_ACCESS:#x} "
                             "are not LOCAL_WRITE, REMOTE_READ/WRITE/ATOMIC"))  # fmt: skip
        else:
            conf.access = access_flags

    def wr_set_mkey_layout_list(self, sge_list: list[SGE]) -> None:
        conf = self._setter("wr_set_mkey_layout_list")
        sges = list(sge_list)
        if "layout" in conf.called:
            conf.fail(einval("wr_set_mkey_layout_list: a layout was already set in this WR"))
        elif len(sges) > conf.mkey.max_entries:
            conf.fail(einval(f"wr_set_mkey_layout_list: {len(sges)} entries exceed the mkey's "
                             f"max_entries={conf.mkey.max_entries}"))  # fmt: skip
        elif not all(isinstance(s, SGE) for s in sges):
            conf.fail(einval("wr_set_mkey_layout_list: every entry must be an SGE"))
        else:
            conf.entries = [(s.lkey, s.addr, s.length, 0) for s in sges]
            conf.repeat = 1
        conf.called.add("layout")

    def wr_set_mkey_layout_interleaved(
        self, repeat_count: int, mr_interleaved_lst: list[Mlx5MrInterleaved]
    ) -> None:
        conf = self._setter("wr_set_mkey_layout_interleaved")
        items = list(mr_interleaved_lst)
        limit = conf.mkey.max_entries - 1  # one entry holds the repeat header, as on mlx5
        if "layout" in conf.called:
            conf.fail(einval("wr_set_mkey_layout_interleaved: a layout was already set"))
        elif len(items) > limit:
            conf.fail(einval(f"wr_set_mkey_layout_interleaved: {len(items)} entries exceed the "
                             f"mkey's max_entries - 1 = {limit} (one entry holds the repeat "
                             "header)"))  # fmt: skip
        elif not isinstance(repeat_count, int) or repeat_count < 1:
            conf.fail(einval(f"wr_set_mkey_layout_interleaved: repeat_count={repeat_count!r}"))
        elif not all(isinstance(i, Mlx5MrInterleaved) for i in items):
            conf.fail(einval("wr_set_mkey_layout_interleaved: entries must be Mlx5MrInterleaved"))
        else:
            conf.entries = [(i.lkey, i.addr, i.bytes_count, i.bytes_skip) for i in items]
            conf.repeat = repeat_count
        conf.called.add("layout")

    def wr_set_mkey_sig_block(self, block_attr: Mlx5SigBlockAttr) -> None:
        conf = self._setter("wr_set_mkey_sig_block")
        if not conf.mkey.signature:
            conf.fail(einval("wr_set_mkey_sig_block: the mkey was not created with "
                             "MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE"))  # fmt: skip
            return
        try:
            conf.sig = sig_block(block_attr)
            conf.sig_set = True
        except PyverbsRDMAError as exc:
            conf.fail(exc)

    # --- the legacy helpers and the rest of mlx5: not offered ----------------------------------
    wr_mr_list = _unsupported("wr_mr_list")
    wr_mr_interleaved = _unsupported("wr_mr_interleaved")
    wr_set_mkey_crypto = _unsupported("wr_set_mkey_crypto")
    wr_set_dc_addr = _unsupported("wr_set_dc_addr")
    wr_set_dc_addr_stream = _unsupported("wr_set_dc_addr_stream")
    wr_raw_wqe = _unsupported("wr_raw_wqe")
    wr_memcpy = _unsupported("wr_memcpy")
    query_lag_port = _unsupported("query_lag_port")
    modify_lag_port = _unsupported("modify_lag_port")
    modify_qp_sched_elem = _unsupported("modify_qp_sched_elem")
    modify_udp_sport = _unsupported("modify_udp_sport")
    map_ah_to_qp = _unsupported("map_ah_to_qp")
    modify_dci_stream_channel_id = _unsupported("modify_dci_stream_channel_id")

    # --- cancelling -------------------------------------------------------------------------------
    def cancel_posted_send_wrs(self, wr_id: int) -> int:
        """Turn the posted, unstarted send WRs with ``wr_id`` into NOPs; returns how many.

        Only in SQD, on a SIG_PIPELINING QP; otherwise EINVAL and nothing changes."""
        rc = qp_cancel_posted_send_wrs(self, wr_id)
        if rc < 0:
            state = _enum_name(ibv_qp_state, self.qp_state)
            why = ("the QP was not created with MLX5DV_QP_CREATE_SIG_PIPELINING"
                   if not self.sig_pipelining else
                   f"the QP is in {state}; cancel works only in SQD (after "
                   "IBV_EVENT_SQ_DRAINED)")  # fmt: skip
            raise PyverbsRDMAError(f"Failed to cancel send WRs: {why}", -rc)
        return rc

    # --- posting: post-time checks of mkeys -------------------------------------------------------
    def _mkey_valid(self, mkey: Mlx5Mkey) -> bool:
        for m, valid in reversed(self._marks):
            if m is mkey:
                return valid
        return mkey.posted_valid

    def _check_mkeys(self, sges: list[SGE], where: str, inline: bool) -> None:
        if inline:
            return
        mkeys = self._ctx.mkeys  # type: ignore[attr-defined]
        for sge in sges:
            mk = mkeys.get(sge.lkey)
            if mk is not None and not self._mkey_valid(mk):
                raise einval(f"{where}: mkey {sge.lkey:#x} is not configured (it was never "
                             "configured, or was invalidated); configure it with "
                             "wr_mkey_configure before using it")  # fmt: skip

    def _build_send(self, w: SendWR, n: int, type1_bind: bool = False) -> SendWQE:
        conf: _MkeyConf | None = getattr(w, "mkey_conf", None)
        if conf is not None:
            wqe = self._build_configure(w, conf, n)
            self._marks.append((conf.mkey, True))
            return wqe
        where = f"post_send: WR #{n} (wr_id={w.wr_id})"
        self._check_mkeys(list(w.sg), where, bool(w.send_flags & IBV_SEND_INLINE))
        wqe = super()._build_send(w, n, type1_bind)
        if w.opcode == IBV_WR_LOCAL_INV:
            mk = self._ctx.mkeys.get(w.imm_data & 0xFFFFFFFF)  # type: ignore[attr-defined]
            if mk is not None:
                self._marks.append((mk, False))
        return wqe

    def _build_configure(self, w: SendWR, conf: _MkeyConf, n: int) -> SendWQE:
        """The configuration WR as a driver WQE (``IBV_WR_DRIVER1``): it names the
        mkey by handle and carries the configuration inline (docs/signature.md);
        the device applies it when the WQE runs, in send-queue order."""
        where = f"wr_complete: WR #{n} (wr_mkey_configure, wr_id={w.wr_id})"
        if conf.error is not None:
            raise type(conf.error)(f"{where}: {conf.error}", conf.error.error_code)
        if conf.setters != conf.num_setters:
            raise einval(f"{where}: {conf.num_setters} setter(s) were announced, "
                         f"{conf.setters} called")  # fmt: skip
        state = self._state()
        if state not in _POST_STATES:
            raise einval(f"{where}: the QP is in {_enum_name(ibv_qp_state, state)}; "
                         "move it to RTS first")  # fmt: skip
        sq = self.sq
        assert sq is not None
        if sq.used >= sq.size:
            raise enomem(self._sq_full_message(where))
        data = encode_mkey_conf(conf)
        if len(data) > self.cap.max_inline_data:
            most = (self.cap.max_inline_data - records.MkeyConf.size()
                    - 2 * records.MkeySigDomain.size()) // records.MkeyEntry.size()  # fmt: skip
            raise einval(f"{where}: {len(conf.entries or ())} layout entries do not fit one "
                         f"configuration WQE (at most {most})")  # fmt: skip
        flags = w.send_flags
        signaled = bool(flags & IBV_SEND_SIGNALED) or self.sq_sig_all
        wqe = SendWQE(w.wr_id, WR_DRIVER1, signaled, [], 0)
        wqe.fence = bool(flags & IBV_SEND_FENCE)
        wqe.se = bool(flags & IBV_SEND_SOLICITED)
        wqe.driver_op = conf.mkey.dev_handle
        wqe.inline = data
        return wqe

    def post_send(self, wr: SendWR, bad_wr: SendWR | None = None) -> None:
        try:
            super().post_send(wr, bad_wr)
        finally:
            self._commit_marks()

    def wr_complete(self) -> None:
        self._conf = None
        try:
            super().wr_complete()
        except Exception:
            self._marks.clear()
            raise
        self._commit_marks()

    def wr_abort(self) -> None:
        self._conf = None
        super().wr_abort()

    def _commit_marks(self) -> None:
        for mk, valid in self._marks:
            mk.posted_valid = valid
        self._marks.clear()

    def post_recv(self, wr: RecvWR, bad_wr: RecvWR | None = None) -> None:
        w: RecvWR | None = wr
        n = 0
        while w is not None:
            self._check_mkeys(list(w.sg), f"post_recv: WR #{n} (wr_id={w.wr_id})", False)
            w = w.next_wr
            n += 1
        super().post_recv(wr, bad_wr)


def qp_cancel_posted_send_wrs(qp: Mlx5QP, wr_id: int) -> int:
    """``mlx5dv_qp_cancel_posted_send_wrs``: the count cancelled, or ``-EINVAL``.

    Works only on a SIG_PIPELINING QP in SQD; otherwise nothing changes."""
    require(qp, Mlx5QP, "qp")
    qp._check_open()
    body = records.CancelSend(qp.dev_handle, 0, wr_id & 0xFFFFFFFFFFFFFFFF)
    try:
        return int(qp._ctx.provider.call(ops.CANCEL_SEND, body).count)
    except PyverbsRDMAError as exc:
        if exc.error_code == errno.EINVAL:
            return -errno.EINVAL
        raise


#: inline room a configuration WQE may use: the header, 40 layout entries, two domains
MKEY_WQE_INLINE = 1024


def encode_mkey_conf(conf: _MkeyConf) -> bytes:
    """A configuration as the inline data of its driver WQE (``records.MkeyConf``,
    its ``MkeyEntry`` list, and with a signature change two ``MkeySigDomain``)."""
    flags = 0
    if conf.access is not None:
        flags |= records.MKEY_CONF_ACCESS
    if conf.entries is not None:
        flags |= records.MKEY_CONF_LAYOUT
    set_sig = conf.sig_set or conf.reset_sig
    if set_sig:
        flags |= records.MKEY_CONF_SIG
    sig = conf.sig if conf.sig_set else None
    entries = conf.entries or []
    out = [records.MkeyConf(flags, conf.access or 0, conf.repeat, len(entries),
                        sig.check_mask if sig else 0, sig.copy_mask if sig else 0, 0,
                        0).pack()]  # fmt: skip
    out += [records.MkeyEntry(addr, lkey, count, skip, 0).pack()
            for lkey, addr, count, skip in entries]  # fmt: skip
    if set_sig:
        for d in (sig.mem, sig.wire) if sig else (None, None):
            if d is None:
                out.append(records.MkeySigDomain(0, 0, 0, 0, 0, 0, 0, 0, 0).pack())
            else:
                out.append(records.MkeySigDomain(1, int(d.kind), int(d.escape), int(d.ref_remap),
                                             d.block_size, d.seed, d.app_tag, d.ref_tag,
                                             0).pack())  # fmt: skip
    return b"".join(out)


# --- pyverbs.providers.mlx5 under the opt-in ---------------------------------------------------

#: What ``pyverbs.providers.mlx5.<module>`` takes from here when opted in.
PYVERBS_NAMES: dict[str, tuple[str, ...]] = {
    "mlx5dv": ("Mlx5Context", "Mlx5DVContextAttr", "Mlx5DVQPInitAttr", "Mlx5DVCQInitAttr",
               "Mlx5QP"),
    "mlx5dv_mkey": ("Mlx5SigCrc", "Mlx5SigT10Dif", "Mlx5SigBlockDomain", "Mlx5SigBlockAttr",
                    "Mlx5SigErr", "Mlx5MkeyErr", "Mlx5MkeyConfAttr", "Mlx5MrInterleaved",
                    "Mlx5Mkey"),
}  # fmt: skip


def pyverbs_names(module: str) -> dict[str, object]:
    """The classes ``pyverbs.providers.mlx5.<module>`` offers from here: all of
    :data:`PYVERBS_NAMES` when ``SOFTVERBS_MLX5=sig`` is set, else none (the
    vendor stubs stay, and nothing claims to be mlx5)."""
    if not opted_in():
        return {}
    g = globals()
    return {name: g[name] for name in PYVERBS_NAMES.get(module, ())}


__all__ = [
    "FEATURES",
    "FEATURE_ENV",
    "MLX5DV_MKEY_CONF_FLAG_RESET_SIG_ATTR",
    "MLX5DV_WC_UMR",
    "Mlx5Context",
    "Mlx5DVCQInitAttr",
    "Mlx5DVContextAttr",
    "Mlx5DVQPInitAttr",
    "Mlx5Mkey",
    "Mlx5MkeyConfAttr",
    "Mlx5MkeyErr",
    "Mlx5MrInterleaved",
    "Mlx5QP",
    "Mlx5SigBlockAttr",
    "Mlx5SigBlockDomain",
    "Mlx5SigCrc",
    "Mlx5SigErr",
    "Mlx5SigT10Dif",
    "opted_in",
    "parse_features",
    "pyverbs_names",
    "qp_cancel_posted_send_wrs",
    "sig_block",
    "sig_image",
]
