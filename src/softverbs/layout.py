"""Fixed binary layouts: records declared once, packed in Python, emitted as C.

A :class:`Record` subclass declares its fields with the annotated types
below (or another Record, embedded).  The layout is little-endian and
packed, and the declaration order must keep every field naturally aligned
(checked when the class is created), so the C struct :func:`c_struct`
writes for it is the same bytes with no packing attribute.  The device
service's protocol (:mod:`softverbs.device.protocol`) and the shared ring
entries (:mod:`softverbs.engine.rings`) are declared this way, so Python,
the generated ``protocol.h`` and the docs cannot disagree.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import (
    Annotated,
    Any,
    ClassVar,
    dataclass_transform,
    get_args,
    get_origin,
    get_type_hints,  # fmt: skip
)


class LayoutError(Exception):
    """Bytes that do not hold the record they should (too short)."""


U8 = Annotated[int, "B"]
U16 = Annotated[int, "H"]
U32 = Annotated[int, "I"]
U64 = Annotated[int, "Q"]
I32 = Annotated[int, "i"]
Gid = Annotated[bytes, "16s"]  #: a GID, network byte order
Name = Annotated[str, "64s"]  #: NUL-padded UTF-8

_C_TYPES = {"B": "uint8_t", "H": "uint16_t", "I": "uint32_t", "Q": "uint64_t", "i": "int32_t"}


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    code: str  #: struct code of one element ("I", "16s", or a record's whole format)
    record: type[Record] | None  #: an embedded record
    offset: int
    size: int
    doc: str


@dataclass_transform()
class Record:
    """A fixed-layout record: each subclass is a dataclass with a compiled struct.

    Fields are declared with the annotated types above (or another Record,
    embedded).  The layout is packed little-endian; the declaration order
    must keep every field naturally aligned (checked at import), so the C
    struct generated from it needs no packing attribute.
    """

    _fields: ClassVar[tuple[_Field, ...]] = ()
    _struct: ClassVar[struct.Struct] = struct.Struct("<")
    _count: ClassVar[int] = 0  #: values the struct packs (embedded records flattened)
    _flat: ClassVar[bool] = True  #: no embedded record and no name field
    #: field docs: name -> text
    DOCS: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(cls)
        hints = get_type_hints(cls, include_extras=True)
        fields: list[_Field] = []
        offset = 0
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            hint = hints[f.name]
            if isinstance(hint, type) and issubclass(hint, Record):
                code, record, size, align = hint._struct.format[1:], hint, hint._struct.size, 8
            else:
                if get_origin(hint) is not Annotated:
                    raise TypeError(f"{cls.__name__}.{f.name}: not a wire type")
                code = get_args(hint)[1]
                record = None
                size = struct.calcsize("<" + code)
                align = size if code in _C_TYPES else 1
            if offset % align:
                raise TypeError(f"{cls.__name__}.{f.name} at offset {offset} is not "
                                f"{align}-byte aligned")  # fmt: skip
            fields.append(_Field(f.name, code, record, offset, size, cls.DOCS.get(f.name, "")))
            offset += size
        if offset % 8 and fields:
            raise TypeError(f"{cls.__name__} is {offset} bytes, not a multiple of 8")
        cls._fields = tuple(fields)
        cls._struct = struct.Struct("<" + "".join(f.code for f in fields))
        cls._count = len(cls._struct.unpack(bytes(cls._struct.size)))
        # plain numbers and GIDs only: the unpacked values are the constructor's arguments
        cls._flat = all(f.record is None and f.code != "64s" for f in fields)

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # replaced by the dataclass
        raise NotImplementedError

    # --- encoding -------------------------------------------------------------------------------
    def _values(self) -> list[Any]:
        out: list[Any] = []
        for f in self._fields:
            value = getattr(self, f.name)
            if f.record is not None:
                out.extend(value._values())
            elif isinstance(value, str):
                out.append(value.encode())
            else:
                out.append(value)
        return out

    def pack(self) -> bytes:
        try:
            return self._struct.pack(*self._values())
        except struct.error as exc:
            raise ValueError(f"{type(self).__name__}: {exc}") from None

    @classmethod
    def size(cls) -> int:
        return cls._struct.size

    @classmethod
    def index_of(cls, name: str) -> int:
        """Where field ``name`` is in an array of items of its own width that
        starts with the record (its offset over its size; fields are aligned):
        the index a memoryview cast to its format (``"Q"``, ``"I"``, ...) reads
        and stores it at, plus the record's offset over that width."""
        f = next(f for f in cls._fields if f.name == name)
        if f.code not in _C_TYPES:
            raise TypeError(f"{cls.__name__}.{name} is not a number field")
        return f.offset // f.size

    @classmethod
    def unpack(cls, data: bytes | memoryview, offset: int = 0) -> Any:
        """The record at ``offset`` of ``data`` (ProtocolError if too short)."""
        if len(data) - offset < cls._struct.size:
            raise LayoutError(f"{cls.__name__} needs {cls._struct.size} bytes, "
                                f"got {len(data) - offset}")  # fmt: skip
        values = cls._struct.unpack_from(data, offset)
        return cls(*values) if cls._flat else cls._from(list(values))

    @classmethod
    def _from(cls, values: list[Any]) -> Any:
        kw: dict[str, Any] = {}
        for f in cls._fields:
            if f.record is not None:
                n = f.record._count
                kw[f.name] = f.record._from(values[:n])
                del values[:n]
                continue
            value = values.pop(0)
            if f.code == "64s":
                value = value.split(b"\0", 1)[0].decode("utf-8", "replace")
            kw[f.name] = value
        return cls(**kw)




def c_name(cls: type[Record]) -> str:
    """``SendWQEHeader`` -> ``sv_send_wqe_header``."""
    out = ""
    name = cls.__name__
    for i, ch in enumerate(name):
        boundary = ch.isupper() and i and (not name[i - 1].isupper()
                                           or (i + 1 < len(name) and name[i + 1].islower()))
        out += ("_" + ch.lower()) if boundary else ch.lower()
    return "sv_" + out


def c_struct(cls: type[Record]) -> str:
    """The C declaration of ``cls``, with a static size check."""
    lines = [f"struct {c_name(cls)} {{"]
    for f in cls._fields:
        if f.record is not None:
            decl = f"struct {c_name(f.record)} {f.name};"
        elif f.code in _C_TYPES:
            decl = f"{_C_TYPES[f.code]} {f.name};"
        else:
            decl = f"char {f.name}[{f.size}];"
        comment = f" /* {f.doc} */" if f.doc else ""
        lines.append(f"\t{decl:<40}/* @{f.offset} */{comment}")
    lines.append("};")
    lines.append(f"_Static_assert(sizeof(struct {c_name(cls)}) == {cls.size()}, "
                 f"\"{c_name(cls)}\");")  # fmt: skip
    return "\n".join(lines)


def markdown_table(cls: type[Record]) -> list[str]:
    """A record as a Markdown table: offset, size, field, type."""
    lines = [f"**{cls.__name__}** ({cls.size()} bytes)", "",
             "| offset | size | field | type |", "|---:|---:|---|---|"]  # fmt: skip
    for f in cls._fields:
        kind = (f.record.__name__ if f.record is not None
                else _C_TYPES.get(f.code, f"{f.size} bytes"))  # fmt: skip
        doc = f" — {f.doc}" if f.doc else ""
        lines.append(f"| {f.offset} | {f.size} | `{f.name}` | {kind}{doc} |")
    return lines


def with_embedded(records: list[type[Record]]) -> list[type[Record]]:
    """``records`` and the records they embed, each once, embedded ones first."""
    seen: list[type[Record]] = []

    def visit(cls: type[Record]) -> None:
        for f in cls._fields:
            if f.record is not None:
                visit(f.record)
        if cls not in seen:
            seen.append(cls)

    for cls in records:
        visit(cls)
    return seen
