"""Device configuration: the ``softverbs link`` table.

Like ``rdma link add rxe0 type rxe netdev eth0`` for Linux soft-RoCE, a
softverbs UDP device is bound to a network interface (or to one address).
The table lives in a small JSON file:

* ``$SOFTVERBS_CONFIG`` if set, else
* ``$XDG_CONFIG_HOME/softverbs/links.json`` (``~/.config/softverbs/links.json``).

With no configured link there is one device, the in-process ``sv0``.
``SOFTVERBS_INPROC_DEVICES=sv0,sv1`` names several in-process devices.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from softverbs.errors import ConfigError


@dataclass
class LinkSpec:
    """One configured device."""

    name: str
    kind: str = "inproc"  #: "inproc" or "udp"
    netdev: str = ""  #: interface name ("" with --addr only)
    addrs: list[str] = field(default_factory=list)  #: explicit addresses (--addr)
    mtu: int = 0  #: active path MTU in bytes; 0 = derived from the netdev


def config_path() -> Path:
    env = os.environ.get("SOFTVERBS_CONFIG")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "softverbs" / "links.json"


def load_links() -> list[LinkSpec]:
    path = config_path()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the softverbs link table {path}: {exc}") from None
    try:
        return [
            LinkSpec(
                name=str(entry["name"]),
                kind="udp",
                netdev=str(entry.get("netdev", "")),
                addrs=[str(a) for a in entry.get("addrs", [])],
                mtu=int(entry.get("mtu", 0)),
            )
            for entry in raw.get("links", [])
        ]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"the softverbs link table {path} is malformed ({type(exc).__name__}: {exc}); "
            "fix or remove it (it is written by 'softverbs link add')"
        ) from None


def save_links(links: list[LinkSpec]) -> None:
    path = config_path()
    data = {"links": [{k: v for k, v in asdict(s).items() if k != "kind"} for s in links]}
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(f"cannot write the softverbs link table {path}: {exc.strerror}") from None


def inproc_names() -> list[str]:
    names = os.environ.get("SOFTVERBS_INPROC_DEVICES", "sv0").split(",")
    return [n.strip() for n in names if n.strip()]
