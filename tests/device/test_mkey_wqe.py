"""The mkey configuration a driver WQE carries (device.records MkeyConf and
friends): what a client encodes, the device decodes to the same thing, and
any bytes at all are either a configuration or a ValueError -- never another
exception (the device turns it into a WQE completed with LOC_QP_OP_ERR)."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from softverbs.device import records
from softverbs.device.mr import mkey_configure
from softverbs.engine.signature import Escape, SigBlock, SigDomain, SigKind
from softverbs.ext.mlx5dv import _MkeyConf, encode_mkey_conf


class Recorder:
    """Stands for the key's transform: records what configure() was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def configure(self, key: object, pd: object, entries: object, repeat: int, access: object,
                  sig: object, set_sig: bool) -> None:  # fmt: skip
        self.calls.append((entries, repeat, access, sig, set_sig))


def _key() -> SimpleNamespace:
    return SimpleNamespace(xform=Recorder())


domains = st.one_of(st.none(), st.builds(
    SigDomain, st.sampled_from(list(SigKind)), st.sampled_from([512, 4096]),
    st.sampled_from([0, 0xFFFFFFFF]), st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF),
    st.booleans(), st.sampled_from(list(Escape))))  # fmt: skip


@given(entries=st.one_of(st.none(), st.lists(st.tuples(
           st.integers(0, 0xFFFFFFFF), st.integers(0, (1 << 64) - 1),
           st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF)), max_size=39)),
       repeat=st.integers(1, 0xFFFF), access=st.one_of(st.none(), st.integers(0, 0xFFFF)),
       mem=domains, wire=domains, masks=st.tuples(st.integers(0, 255), st.integers(0, 255)),
       reset=st.booleans())  # fmt: skip
def test_what_is_encoded_is_what_configures(
    entries: list[tuple[int, int, int, int]] | None,
    repeat: int,
    access: int | None,
    mem: SigDomain | None,
    wire: SigDomain | None,
    masks: tuple[int, int],
    reset: bool,
) -> None:
    sig = SigBlock(mem, wire, *masks) if mem is not None or wire is not None else None
    conf = _MkeyConf(mkey=None, num_setters=0, reset_sig=reset)  # type: ignore[arg-type]
    conf.entries, conf.repeat, conf.access = entries, repeat, access
    conf.sig, conf.sig_set = sig, sig is not None
    key = _key()
    mkey_configure(key, "pd", encode_mkey_conf(conf))()
    assert key.xform.calls == [(entries, repeat, access, sig, sig is not None or reset)]


@settings(max_examples=2000)
@given(data=st.binary(max_size=400))
def test_any_bytes_are_a_configuration_or_a_value_error(data: bytes) -> None:
    try:
        op = mkey_configure(_key(), "pd", data)
    except ValueError:
        return
    op()


def test_a_short_or_lying_configuration_is_refused() -> None:
    head = records.MkeyConf(records.MKEY_CONF_LAYOUT, 0, 1, 5, 0, 0, 0, 0).pack()
    for data in (b"", head[:10], head, head + bytes(records.MkeyEntry.size() * 4)):
        try:
            mkey_configure(_key(), "pd", data)
        except ValueError as exc:
            assert "mkey configuration" in str(exc)
        else:
            raise AssertionError(f"{len(data)} bytes were taken for a 5-entry configuration")


def test_auto_copy_lets_the_device_work_out_the_copy_mask() -> None:
    """MKEY_CONF_AUTO_COPY (what the C libmlx5 sends without
    MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK): the copy mask given is ignored, the
    device's own (auto_copy_mask) is used."""
    from softverbs.engine.signature import auto_copy_mask

    t10 = records.MkeySigDomain(1, int(SigKind.T10DIF), 0, 0, 512, 0, 0xABCD, 0x100, 0)
    other = records.MkeySigDomain(1, int(SigKind.T10DIF), 0, 0, 512, 0, 0xABCD, 0x200, 0)
    flags = records.MKEY_CONF_SIG | records.MKEY_CONF_AUTO_COPY
    data = records.MkeyConf(flags, 0, 1, 0, 0xFF, 0x5A, 0, 0).pack() + t10.pack() + other.pack()
    key = _key()
    mkey_configure(key, "pd", data)()
    sig = key.xform.calls[0][3]
    mem = SigDomain(SigKind.T10DIF, 512, 0, 0xABCD, 0x100)
    wire = SigDomain(SigKind.T10DIF, 512, 0, 0xABCD, 0x200)
    assert sig == SigBlock(mem, wire, 0xFF, auto_copy_mask(mem, wire))
    assert sig.copy_mask not in (0, 0x5A)
