"""``pyverbs.utils``: GID text helpers and value-to-text helpers."""

from softverbs.verbs.strings import (
    access_flags_to_str,
    be64toh,
    gid_str,
    gid_str_to_array,
    mig_state_to_str,
    mtu_to_str,
    qp_state_to_str,
    qp_type_to_str,
    rereg_error_to_str,
)

__all__ = [
    "access_flags_to_str",
    "be64toh",
    "gid_str",
    "gid_str_to_array",
    "mig_state_to_str",
    "mtu_to_str",
    "qp_state_to_str",
    "qp_type_to_str",
    "rereg_error_to_str",
]
