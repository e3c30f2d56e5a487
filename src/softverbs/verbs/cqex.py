"""Extended completion queues (pyverbs ``CQEX``): ``ibv_create_cq_ex`` and the
``ibv_start_poll`` / ``ibv_next_poll`` / ``ibv_end_poll`` iterator.

A CQEX is the same ring as a :class:`~softverbs.verbs.cq.CQ`; only the way
completions are read differs.  ``start_poll`` takes the first CQE and makes
it *current*, ``poll_next`` the next one, and the ``read_*`` methods and the
``status`` / ``wr_id`` properties read fields of the current one.  Both return
0, or ``ENOENT`` when no completion is waiting, as the C calls do.  Taking a
CQE gives its send or receive queue slot back, exactly as ``CQ.poll`` does,
so the unsignaled-completion rules hold unchanged.

Which ``wc_flags`` a CQ may be created with is what the soft device can fill
in: the standard fields (byte_len, imm, qp_num, src_qp, slid, sl,
dlid_path_bits).  It keeps no hardware clock, strips no VLANs, tags no flows
and matches no tags, so the timestamp, CVLAN, flow-tag and TM flags are
EOPNOTSUPP, as on a device without them.  Creation flags: a single-threaded
CQ is accepted (it is only a locking hint); ``IGNORE_OVERRUN`` is
EOPNOTSUPP, since an overrun always puts a softverbs CQ in error.
"""

from __future__ import annotations

import errno
from typing import Any

from softverbs.engine.rings import CQE
from softverbs.enums import (
    IBV_CQ_INIT_ATTR_MASK_FLAGS,
    IBV_CQ_INIT_ATTR_MASK_PD,
    IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN,
    IBV_CREATE_CQ_ATTR_SINGLE_THREADED,
    IBV_WC_STANDARD_FLAGS,
    ibv_create_cq_wc_flags,
)
from softverbs.errors import PyverbsRDMAError, PyverbsUserError, eopnotsupp
from softverbs.verbs.base import PyverbsObject, as_count, require
from softverbs.verbs.cq import CompChannel, CQBase, be32_field
from softverbs.verbs.device import Context
from softverbs.verbs.pd import PD, ParentDomain
from softverbs.verbs.strings import create_wc_flags_to_str

#: The wc_flags a softverbs CQ can report.
SUPPORTED_WC_FLAGS = IBV_WC_STANDARD_FLAGS
_ALL_WC_FLAGS = int(sum(int(f) for f in ibv_create_cq_wc_flags))
_KNOWN_COMP_MASK = IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD
_KNOWN_CREATE_FLAGS = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN


class PollCqAttr(PyverbsObject):
    """``ibv_poll_cq_attr``: only a ``comp_mask``, which must be 0."""

    def __init__(self) -> None:
        super().__init__()
        self.comp_mask = 0


class WcTmInfo(PyverbsObject):
    """``ibv_wc_tm_info``: the tag and private data of a tag-matched completion."""

    def __init__(self, tag: int = 0, priv: int = 0) -> None:
        super().__init__()
        self.tag = tag
        self.priv = priv


class CqInitAttrEx(PyverbsObject):
    """``ibv_cq_init_attr_ex``:
    ``CqInitAttrEx(cqe, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain)``."""

    def __init__(
        self,
        cqe: int = 100,
        channel: CompChannel | None = None,
        comp_vector: int = 0,
        wc_flags: int = 0,
        comp_mask: int = 0,
        flags: int = 0,
        parent_domain: Any = None,
    ) -> None:
        super().__init__()
        require(channel, CompChannel, "channel", optional=True)
        require(parent_domain, PD, "parent_domain", optional=True)
        for name, value in (("wc_flags", wc_flags), ("comp_mask", comp_mask), ("flags", flags)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise PyverbsUserError(f"{name} must be an int, got {type(value).__name__}")
        self.cqe = cqe
        self.channel = channel
        self.comp_vector = comp_vector
        self.wc_flags = wc_flags
        self.comp_mask = comp_mask
        self.flags = flags
        self.parent_domain = parent_domain
        self.cq_context: Any = None

    @property
    def comp_channel(self) -> CompChannel | None:
        return self.channel

    @comp_channel.setter
    def comp_channel(self, val: CompChannel) -> None:
        require(val, CompChannel, "comp_channel")
        self.channel = val

    def __str__(self) -> str:
        f = "{:22}: {:<20}\n"
        return (f.format("Number of CQEs", self.cqe)
                + f.format("WC flags", create_wc_flags_to_str(self.wc_flags))
                + f.format("comp mask", self.comp_mask)
                + f.format("flags", self.flags))  # fmt: skip


class CQEX(CQBase):
    """An extended CQ: ``CQEX(ctx, CqInitAttrEx(...))``."""

    def __init__(self, context: Context, init_attr: CqInitAttrEx | None = None) -> None:
        if init_attr is None:
            init_attr = CqInitAttrEx()
        require(init_attr, CqInitAttrEx, "init_attr")
        self._check_ex_attr(init_attr)
        super().__init__(context, init_attr.cqe, init_attr.cq_context, init_attr.channel,
                         init_attr.comp_vector)  # fmt: skip
        self.wc_flags = init_attr.wc_flags
        self.create_flags = init_attr.flags
        pd = init_attr.parent_domain
        self.parent_domain = pd
        if pd is not None:
            pd.add_ref(self)
        self._cur: CQE | None = None
        self._polling = False

    @staticmethod
    def _check_ex_attr(attr: CqInitAttrEx) -> None:
        what = "Failed to create extended CQ"
        if attr.comp_mask & ~_KNOWN_COMP_MASK:
            raise eopnotsupp(f"{what}: unknown comp_mask bits "
                             f"{attr.comp_mask & ~_KNOWN_COMP_MASK:#x}")  # fmt: skip
        if attr.wc_flags & ~_ALL_WC_FLAGS:
            raise eopnotsupp(f"{what}: unknown wc_flags bits {attr.wc_flags & ~_ALL_WC_FLAGS:#x}")
        unsupported = attr.wc_flags & ~SUPPORTED_WC_FLAGS
        if unsupported:
            raise eopnotsupp(
                f"{what}: softverbs cannot report {create_wc_flags_to_str(unsupported).strip()}"
                " (no device clock, VLAN stripping, flow tags or tag matching)"
            )
        flags = attr.flags if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS else 0
        if flags & ~_KNOWN_CREATE_FLAGS:
            raise eopnotsupp(f"{what}: unknown flags {flags & ~_KNOWN_CREATE_FLAGS:#x}")
        if flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN:
            raise eopnotsupp(f"{what}: IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN is not supported; "
                             "an overrun always puts a softverbs CQ in error")  # fmt: skip
        if attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD:
            require(attr.parent_domain, ParentDomain, "parent_domain")

    # --- the poll iterator ------------------------------------------------------------------
    def start_poll(self, attr: PollCqAttr | None = None) -> int:
        """Begin a batch: 0 with the first completion current, or ENOENT."""
        self._check_open()
        if attr is not None:
            require(attr, PollCqAttr, "attr")
            if attr.comp_mask:
                raise PyverbsRDMAError("start_poll: PollCqAttr.comp_mask must be 0",
                                       errno.EINVAL)  # fmt: skip
        self._polling = True
        return self._advance()

    def poll_next(self) -> int:
        """The next completion of the batch: 0, or ENOENT."""
        self._check_open()
        if not self._polling:
            raise PyverbsUserError("poll_next() called without a successful start_poll()")
        return self._advance()

    def end_poll(self) -> None:
        """End the batch."""
        self._polling = False
        self._cur = None

    def _advance(self) -> int:
        cqes = self._take(1)
        if not cqes:
            self._cur = None
            return errno.ENOENT
        self._cur = cqes[0]
        return 0

    def _current(self) -> CQE:
        if self._cur is None:
            raise PyverbsUserError("no current completion: call start_poll() (or poll_next()) "
                                   "and check that it returned 0")  # fmt: skip
        return self._cur

    @property
    def status(self) -> int:
        return int(self._current().status)

    @status.setter
    def status(self, val: int) -> None:
        self._current().status = val

    @property
    def wr_id(self) -> int:
        return int(self._current().wr_id)

    @wr_id.setter
    def wr_id(self, val: int) -> None:
        self._current().wr_id = val

    @property
    def reason(self) -> str:
        """Why the current completion failed, in words (a softverbs addition)."""
        return str(self._current().reason)

    def read_opcode(self) -> int:
        return int(self._current().opcode)

    def read_vendor_err(self) -> int:
        return int(self._current().vendor_err)

    def read_byte_len(self) -> int:
        return int(self._current().byte_len)

    def read_imm_data(self) -> int:
        return be32_field(self._current().imm)

    def read_qp_num(self) -> int:
        return int(self._current().qp_num)

    def read_src_qp(self) -> int:
        return int(self._current().src_qp)

    def read_wc_flags(self) -> int:
        return int(self._current().wc_flags)

    def read_slid(self) -> int:
        return int(self._current().slid)

    def read_sl(self) -> int:
        return int(self._current().sl)

    def read_dlid_path_bits(self) -> int:
        self._current()
        return 0

    def _not_recorded(self, what: str) -> int:
        raise eopnotsupp(f"read_{what}: softverbs CQs do not record {what}")

    def read_timestamp(self) -> int:
        return self._not_recorded("timestamp")

    def read_completion_wallclock_ns(self) -> int:
        return self._not_recorded("completion_wallclock_ns")

    def read_cvlan(self) -> int:
        return self._not_recorded("cvlan")

    def read_flow_tag(self) -> int:
        return self._not_recorded("flow_tag")

    def read_tm_info(self) -> WcTmInfo:
        self._not_recorded("tm_info")
        return WcTmInfo()

    def __str__(self) -> str:
        f = "{:<22}: {:<20}\n"
        return "Extended CQ:\n" + f.format("Handle", self.handle) + f.format("CQEs", self.cqe)


__all__ = ["CQEX", "CqInitAttrEx", "PollCqAttr", "WcTmInfo", "as_count"]
