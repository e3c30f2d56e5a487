"""Device configuration: the ``softverbs link`` table.

Like ``rdma link add rxe0 type rxe netdev eth0`` for Linux soft-RoCE, a
softverbs UDP device is bound to a network interface (or to one address).
The table lives in a small JSON file:

* ``$SOFTVERBS_CONFIG`` if set, else
* ``$XDG_CONFIG_HOME/softverbs/links.json`` (``~/.config/softverbs/links.json``).

Devices belong to a network namespace, as rxe devices do: a process in
another namespace (a container, ``ip netns exec``) has a table and a host
device of its own, ``links-net<INODE>.json`` and ``softverbsd-net<INODE>.sock``,
keyed by the inode of its ``/proc/self/ns/net`` (:func:`netns_suffix`).  The
initial namespace keeps the plain names.

With no configured link there is one device, the in-process ``sv0``.
``SOFTVERBS_INPROC_DEVICES=sv0,sv1`` names several in-process devices.
"""

from __future__ import annotations

import json
import os
import sys
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
    cc: str = ""  #: congestion control ("" = the default; 'softverbs link set NAME cc ...')
    cc_params: dict[str, int] = field(default_factory=dict)  #: its parameters


#: the initial network namespace's inode (the kernel's PROC_NET_INIT_INO)
INIT_NETNS_INO = 0xEFFFFFF9


def netns_suffix() -> str:
    """``""`` in the initial network namespace (or where ``/proc`` cannot say),
    else ``-net<INODE>``: what names this namespace's link table and socket.

    A network namespace is named by the inode of ``/proc/self/ns/net``, which
    any process can stat for itself; the initial one's is a constant of the
    kernel, so its names stay the same across boots."""
    try:
        ino = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return ""
    return "" if ino == INIT_NETNS_INO else f"-net{ino}"


def config_path() -> Path:
    env = os.environ.get("SOFTVERBS_CONFIG")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "softverbs" / f"links{netns_suffix()}.json"


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
                cc=str(entry.get("cc", "")),
                cc_params={str(k): int(v) for k, v in entry.get("cc_params", {}).items()},
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


# --- which devices a process sees ---------------------------------------------------
#
# By default a process's devices are the host's: ``sv0`` and the links of the
# table above, served by the device service softverbsd (started on demand), so
# processes on one host reach each other as they do through rxe0.
# ``SOFTVERBS_SERVICE=0`` gives a process devices of its own instead, in its
# own address space (what single-process programs that want determinism --
# Simulation, seeded faults -- and softverbs' own tests use);
# ``SOFTVERBS_SERVICE=/path/to/sock`` names the service's socket.

#: the module ``python -m`` runs to start the service (service/__main__.py;
#: the C library's spawn in native/csrc/conn.c names it too)
SERVICE_LAUNCH_MODULE = "softverbs.service"


def service_command(*args: str) -> list[str]:
    """The command line that starts ``softverbsd`` with *args*, in this interpreter."""
    return [sys.executable, "-m", SERVICE_LAUNCH_MODULE, *args]


def service_disabled() -> bool:
    """``SOFTVERBS_SERVICE=0`` (or off/no/false): in-process devices only."""
    return os.environ.get("SOFTVERBS_SERVICE", "").strip().lower() in ("0", "off", "no", "false")


#: ``SOFTVERBS_DOORBELL``: how a client of the service rings its send queues --
#: a ``DOORBELL`` message per post, or a write of the eventfd it passed with
#: ``HELLO`` (docs/rings.md).  The C library reads the same variable (conn.c).
DOORBELLS = ("message", "eventfd")
DEFAULT_DOORBELL = "eventfd"
#: a process rings by eventfd while it holds at most this many send queues (each
#: write makes the service read every one's db), by message beyond (C: SV_BELL_MAX_QUEUES)
BELL_MAX_QUEUES = 16


def doorbell_mode() -> str:
    """``SOFTVERBS_DOORBELL``, one of :data:`DOORBELLS` (ConfigError for another word)."""
    text = os.environ.get("SOFTVERBS_DOORBELL", "").strip().lower() or DEFAULT_DOORBELL
    if text not in DOORBELLS:
        raise ConfigError(f"SOFTVERBS_DOORBELL={text!r}: give one of {', '.join(DOORBELLS)} "
                          f"(how a process rings its send queues)")  # fmt: skip
    return text


def ptracer_left_alone() -> bool:
    """``SOFTVERBS_NO_PTRACER`` set (to anything but ``0``, ``off``, ``no``,
    ``false``): a client of the service does not name it its ptracer after
    ``HELLO`` (``softverbs.verbs.served.name_ptracer``; the C library reads the
    same variable, conn.c), leaving one the program named itself."""
    value = os.environ.get("SOFTVERBS_NO_PTRACER", "")
    return value != "" and value.lower() not in ("0", "off", "no", "false")


#: what --socket options say of the default
SOCKET_HELP = ("the service's socket (default: $SOFTVERBS_SERVICE if it is a path, else "
               "softverbsd.sock in $XDG_RUNTIME_DIR, softverbsd-netINODE.sock in another "
               "network namespace)")  # fmt: skip


def default_socket_path(ignore_env: bool = False) -> str:
    """``$SOFTVERBS_SERVICE`` if it is a path, else one per user and network
    namespace in the runtime dir (:func:`netns_suffix`)."""
    env = "" if ignore_env else os.environ.get("SOFTVERBS_SERVICE", "")
    if env and env.lower() not in ("1", "yes", "on") and not service_disabled():
        return env
    return os.path.join(default_socket_dir(), f"softverbsd{netns_suffix()}.sock")


def default_socket_dir() -> str:
    """The per-user directory of the default socket: the one directory the service
    creates by itself (mode 0700)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/softverbs-{os.getuid()}"
    return os.path.abspath(base)


def ensure_socket_dir(path: str, named_by: str = "SOFTVERBS_SERVICE") -> None:
    """Make sure the directory of socket ``path`` exists before a service starts.

    Only the default directory is created; a directory the user named must exist
    already (a typo must not create ``/nonexistent`` or start a service there).
    The ConfigError names ``named_by`` (the variable or option the path came from)."""
    directory = os.path.dirname(os.path.abspath(path))
    if directory == default_socket_dir():
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if os.stat(directory).st_uid != os.getuid():
            raise ConfigError(f"the service directory {directory} belongs to another user; "
                              "set XDG_RUNTIME_DIR or SOFTVERBS_SERVICE")  # fmt: skip
    elif not os.path.isdir(directory):
        raise ConfigError(f"{named_by}={path}: the directory {directory} does not exist; "
                          "create it, or use the default socket")  # fmt: skip


def inproc_names() -> list[str]:
    names = os.environ.get("SOFTVERBS_INPROC_DEVICES", "sv0").split(",")
    return [n.strip() for n in names if n.strip()]
