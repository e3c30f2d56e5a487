"""``softverbs exec`` and the pyverbs module tree it exposes.

The child-process tests run the real command (``python -m softverbs exec``)
and check what the child sees. The in-process tests check the tree itself,
``softverbs.compat.pyverbs``. Every name it re-exports must be the very
softverbs object, and must be a name that pyverbs' module of the same name
has, so the tree can lack names but never invent them.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

import softverbs
import softverbs.compat
from softverbs import enums
from softverbs.cli import exec_
from softverbs.errors import PyverbsRDMAError, einval
from softverbs.native import PRELOAD
from softverbs.verbs import addr, base, cq, device, mr, pd, qp, srq, strings, wr

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "data" / "pyverbs_programs"
COMPAT = Path(softverbs.compat.__file__).resolve().parent
#: where ``import softverbs`` comes from; children get it too, whatever the install mode
SOFTVERBS_HOME = str(Path(softverbs.__file__).resolve().parents[1])

#: Public module-level names of rdma-core v59's pyverbs modules (frozen; read from
#: the released sources, not at test time).
PYVERBS_NAMES: dict[str, set[str]] = {
    "device": {
        "Device", "Context", "DeviceAttr", "QueryDeviceExInput", "ODPCaps", "PCIAtomicCaps",
        "TSOCaps", "RSSCaps", "PacketPacingCaps", "TMCaps", "CQModerationCaps", "DeviceAttrEx",
        "AllocDmAttr", "DM", "PortAttr", "GIDEntry", "AsyncEvent", "FdArr", "translate_gid_type",
        "guid_format", "translate_transport_type", "translate_node_type", "guid_to_hex",
        "port_state_to_str", "translate_mtu", "translate_link_layer", "translate_port_cap_flags",
        "translate_port_cap_flags2", "translate_device_caps", "str_from_flags",
        "phys_state_to_str", "width_to_str", "speed_to_str", "get_device_list",
        "rdma_get_devices", "translate_event_type",
    },
    "pd": {"PD", "ParentDomainContext", "ParentDomainInitAttr", "ParentDomain"},
    "mr": {"HUGE_PAGE_SIZE", "MR", "MWBindInfo", "MWBind", "MW", "DMMR", "DmaBufMR", "mwtype2str"},
    "cq": {
        "CompChannel", "CQ", "CqInitAttrEx", "CQEX", "WC", "PollCqAttr", "WcTmInfo",
        "cqe_status_to_str", "cqe_opcode_to_str", "flags_to_str", "cqe_flags_to_str",
        "create_wc_flags_to_str",
    },
    "qp": {"QPCap", "QPInitAttr", "QPInitAttrEx", "QPAttr", "ECE", "QP", "DataBuffer", "QPEx"},
    "addr": {"GID", "GRH", "GlobalRoute", "AHAttr", "AH"},
    "wr": {"SGE", "RecvWR", "SendWR", "send_flags_to_str"},
    "srq": {"SrqAttr", "SrqInitAttr", "SrqInitAttrEx", "OpsWr", "SRQ"},
    "base": {"inc_rkey", "PyverbsRDMAErrno", "LOG_LEVEL", "LOG_FORMAT", "PyverbsObject",
             "PyverbsCM", "PyverbsRDMAError"},
    "xrcd": {"XRCDInitAttr", "XRCD"},
    "utils": {"be64toh", "gid_str", "gid_str_to_array", "qp_type_to_str", "qp_state_to_str",
              "mtu_to_str", "access_flags_to_str", "mig_state_to_str", "rereg_error_to_str"},
    "pyverbs_error": {"PyverbsError", "PyverbsRDMAError", "PyverbsUserError"},
    "wq": {"WQInitAttr", "WQAttr", "WQ", "RwqIndTableInitAttr", "RwqIndTable", "RxHashConf"},
    "flow": {"FlowAttr", "Flow", "FlowAction"},
    "spec": {"Spec", "EthSpec", "Ipv4ExtSpec", "TcpUdpSpec", "Ipv6Spec"},
    "fork": {"fork_init", "is_fork_initialized"},
    "dmabuf": {"DmaBuf"},
    "dma_util": {"udma_to_dev_barrier", "udma_from_dev_barrier", "mmio_write64_as_be",
                 "mmio_write32_as_be"},
    "mem_alloc": {"mmap", "madvise", "munmap", "malloc", "posix_memalign", "free", "writebe32",
                  "writebe64", "write", "read32", "read64", "read", "PROT_EXEC_", "PROT_READ_",
                  "PROT_WRITE_", "PROT_NONE_", "MAP_PRIVATE_", "MAP_SHARED_", "MAP_FIXED_",
                  "MAP_ANONYMOUS_", "MAP_STACK_", "MAP_LOCKED_", "MAP_HUGETLB_", "MAP_POPULATE_",
                  "MAP_NORESERVE_", "MAP_GROWSDOWN_"},
}  # fmt: skip
ENUM_MODULES = ("libibverbs_enums", "librdmacm_enums")
MODULES = (*PYVERBS_NAMES, *ENUM_MODULES)


def _env(tmp_path: Path, *pythonpath: str) -> dict[str, str]:
    """A clean child environment: only the given PYTHONPATH, no device config."""
    env = dict(os.environ)
    for key in ("PYTHONPATH", exec_.EXEC_ENV, "SOFTVERBS_INPROC_DEVICES"):
        env.pop(key, None)
    env["SOFTVERBS_CONFIG"] = str(tmp_path / "no-links.json")
    env["PYTHONPATH"] = os.pathsep.join([*pythonpath, SOFTVERBS_HOME])
    return env


Proc = subprocess.CompletedProcess[str]


def _run(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> Proc:
    return subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def sv_exec(*cmd: str, env: dict[str, str], cwd: Path | None = None) -> Proc:
    return _run([sys.executable, "-m", "softverbs", "exec", "--", *cmd], env, cwd)


def _in_compat(path: str) -> bool:
    return Path(path).resolve().is_relative_to(COMPAT)


# --- (a) the child sees softverbs as pyverbs -----------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, os, sys
    import pyverbs
    import pyverbs.device
    import pyverbs.pyverbs_error
    import pyverbs.qp
    import softverbs.errors
    import softverbs.verbs.qp

    out = {
        "file": pyverbs.__file__,
        "devices": repr([d.name for d in pyverbs.device.get_device_list()]),
        "same_qp": pyverbs.qp.QP is softverbs.verbs.qp.QP,
        "same_error": pyverbs.pyverbs_error.PyverbsRDMAError is softverbs.errors.PyverbsRDMAError,
        "marker": os.environ.get("SOFTVERBS_EXEC"),
        "pythonpath": os.environ["PYTHONPATH"].split(os.pathsep),
    }
    try:
        pyverbs.device.Context(name="no-such-device")
    except pyverbs.pyverbs_error.PyverbsRDMAError as exc:
        out["caught"] = type(exc).__name__
    print(json.dumps(out))
    """
)


def test_exec_child_imports_softverbs_as_pyverbs(tmp_path: Path) -> None:
    r = sv_exec(sys.executable, "-c", CHILD, env=_env(tmp_path))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert _in_compat(out["file"]), out["file"]
    assert out["devices"] == "[b'sv0']"
    assert out["same_qp"] and out["same_error"]
    assert out["caught"] == "PyverbsRDMAError"
    assert out["marker"] == "1"
    assert out["pythonpath"][0] == exec_.compat_dir()


def test_exec_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "softverbs"
    if not script.exists():
        pytest.skip("the softverbs console script is not installed next to this interpreter")
    code = "import pyverbs; print(pyverbs.__file__)"
    r = _run([str(script), "exec", sys.executable, "-c", code], _env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert _in_compat(r.stdout.strip())


# --- (b) a real pyverbs is not shadowed, except under exec ---------------------------------------


@pytest.fixture
def fake_real_pyverbs(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "pyverbs").mkdir(parents=True)
    (site / "pyverbs" / "__init__.py").write_text("REAL = True\n")
    return site


WHICH = "import pyverbs; print(pyverbs.__file__)"


def test_plain_python_imports_the_real_pyverbs(tmp_path: Path, fake_real_pyverbs: Path) -> None:
    r = _run([sys.executable, "-c", WHICH], _env(tmp_path, str(fake_real_pyverbs)))
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).resolve().is_relative_to(fake_real_pyverbs.resolve())


def test_exec_wins_over_the_real_pyverbs(tmp_path: Path, fake_real_pyverbs: Path) -> None:
    code = WHICH + "; import os; print(os.environ['PYTHONPATH'])"
    r = sv_exec(sys.executable, "-c", code, env=_env(tmp_path, str(fake_real_pyverbs)))
    assert r.returncode == 0, r.stderr
    file, pythonpath = r.stdout.splitlines()
    assert _in_compat(file)
    # the user's entries are kept, after ours
    assert pythonpath.split(os.pathsep)[:2] == [exec_.compat_dir(), str(fake_real_pyverbs)]


def test_installing_softverbs_adds_no_top_level_pyverbs(tmp_path: Path) -> None:
    code = "import importlib.util as u; s = u.find_spec('pyverbs'); print(s.origin if s else '')"
    r = _run([sys.executable, "-c", code], _env(tmp_path))
    assert r.returncode == 0, r.stderr
    origin = r.stdout.strip()
    # no pyverbs at all, or a real one installed elsewhere, but never ours
    assert not origin or not _in_compat(origin)


def test_packaging_ships_compat_only_under_softverbs() -> None:
    setuptools = pytest.importorskip("setuptools")
    # pyproject: [tool.setuptools.packages.find] where = ["src"] (namespaces on by default)
    packages = setuptools.find_namespace_packages(where=str(ROOT / "src"))
    assert "softverbs.compat.pyverbs" in packages
    assert {p.split(".")[0] for p in packages} == {"softverbs"}


def test_nested_exec_does_not_repeat_the_entry() -> None:
    env = exec_.child_env({"PYTHONPATH": os.pathsep.join([exec_.compat_dir(), "/x"])})
    assert env["PYTHONPATH"].split(os.pathsep) == [exec_.compat_dir(), "/x"]
    assert exec_.child_env({})["PYTHONPATH"] == exec_.compat_dir()


def test_preload_library_goes_last_once() -> None:
    """The caller's preloads (a sanitizer runtime) stay first; a nested exec
    does not add the library twice; without C libraries nothing is preloaded."""
    lib = os.path.join("/libs", PRELOAD)
    env = exec_.child_env({"LD_PRELOAD": "/a.so:/b.so"}, "/libs")
    assert env["LD_PRELOAD"].split() == ["/a.so", "/b.so", lib]
    assert exec_.child_env(env, "/libs")["LD_PRELOAD"].split() == ["/a.so", "/b.so", lib]
    assert "LD_PRELOAD" not in exec_.child_env({}, None)


def test_links_asan_reads_the_needed_libraries(tmp_path: Path) -> None:
    prog = tmp_path / "prog"
    prog.write_bytes(b"\x7fELF" + b"\0" * 100 + b"libasan.so.8\0libc.so.6\0")
    prog.chmod(0o755)
    assert exec_.links_asan(str(prog), None)
    prog.write_bytes(b"\x7fELF" + b"\0" * 100 + b"libc.so.6\0")
    assert not exec_.links_asan(str(prog), None)
    assert not exec_.links_asan(str(tmp_path / "absent"), None)


# --- (c) exit status ------------------------------------------------------------------------------


def test_exit_code_propagates(tmp_path: Path) -> None:
    r = sv_exec(sys.executable, "-c", "import sys; sys.exit(3)", env=_env(tmp_path))
    assert r.returncode == 3


def test_death_by_signal_propagates(tmp_path: Path) -> None:
    # exec replaces the process: the caller sees the signal itself, not a wrapper's code
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    r = sv_exec(sys.executable, "-c", code, env=_env(tmp_path))
    assert r.returncode == -signal.SIGTERM


def test_missing_command_is_127(tmp_path: Path) -> None:
    r = sv_exec("softverbs-no-such-command-xyz", "--flag", env=_env(tmp_path))
    assert r.returncode == 127
    assert "softverbs-no-such-command-xyz: command not found" in r.stderr


def test_non_executable_command_is_126(tmp_path: Path) -> None:
    script = tmp_path / "not-executable.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    r = sv_exec(str(script), env=_env(tmp_path))
    assert r.returncode == 126
    assert "cannot run" in r.stderr


@pytest.mark.parametrize("argv", [["exec"], ["exec", "--"]])
def test_no_command_is_a_usage_error(tmp_path: Path, argv: list[str]) -> None:
    r = _run([sys.executable, "-m", "softverbs", *argv], _env(tmp_path))
    assert r.returncode == 2
    assert "no command given" in r.stderr


def test_command_without_separator(tmp_path: Path) -> None:
    r = _run([sys.executable, "-m", "softverbs", "exec", sys.executable, "-c", "print('ok')"],
             _env(tmp_path))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


# --- (d) genuine pyverbs programs run unchanged --------------------------------------------------


def test_pyverbs_rc_pingpong_runs_under_exec(tmp_path: Path) -> None:
    r = sv_exec(sys.executable, str(PROGRAMS / "rc_pingpong.py"), env=_env(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("PASS")


UNITTEST_SUITE = textwrap.dedent(
    """
    import unittest

    import pyverbs.device as d
    from pyverbs.libibverbs_enums import ibv_port_state
    from pyverbs.pyverbs_error import PyverbsRDMAError


    class DeviceTest(unittest.TestCase):
        def setUp(self):
            self.ctx = d.Context(name=d.get_device_list()[0].name.decode())

        def tearDown(self):
            self.ctx.close()

        def test_query_port(self):
            attr = self.ctx.query_port(1)
            self.assertEqual(attr.state, ibv_port_state.IBV_PORT_ACTIVE)
            for text in (d.phys_state_to_str(attr.state), d.translate_mtu(attr.active_mtu),
                         d.width_to_str(attr.active_width),
                         d.speed_to_str(attr.active_speed, attr.active_speed_ex),
                         d.translate_link_layer(attr.link_layer)):
                self.assertNotIn("Invalid", text)

        def test_query_port_bad_flow(self):
            with self.assertRaises(PyverbsRDMAError) as cm:
                self.ctx.query_port(self.ctx.query_device().phys_port_cnt + 1)
            self.assertIn("Failed to query port", cm.exception.args[0])
            self.assertIn("Invalid argument", cm.exception.args[0])
    """
)


def test_pytest_runs_under_exec(tmp_path: Path) -> None:
    suite = tmp_path / "test_pyverbs_device.py"
    suite.write_text(UNITTEST_SUITE)
    r = sv_exec(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", suite.name,
                env=_env(tmp_path), cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed" in r.stdout


# --- (e) the tree: every module imports, every name is softverbs' own -----------------------------


def _compat(name: str) -> object:
    return importlib.import_module(f"softverbs.compat.pyverbs.{name}")


@pytest.mark.parametrize("name", MODULES)
def test_compat_module_reexports_softverbs_objects(name: str) -> None:
    mod = _compat(name)
    exported = mod.__all__  # type: ignore[attr-defined]
    if name not in ("xrcd",):
        assert exported, f"pyverbs.{name} exports nothing"
    for attr in exported:
        obj = getattr(mod, attr)
        if name in ENUM_MODULES:
            assert obj is getattr(enums, attr), attr
            continue
        if isinstance(obj, int):  # mem_alloc's PROT_*_/MAP_*_: softverbs.hostmem's constants
            assert obj == getattr(importlib.import_module("softverbs.hostmem"), attr), attr
            continue
        home = obj.__module__
        assert home.startswith("softverbs.") and not home.startswith("softverbs.compat"), attr
        assert getattr(sys.modules[home], attr) is obj, attr


@pytest.mark.parametrize("name", list(PYVERBS_NAMES))
def test_compat_module_invents_no_names(name: str) -> None:
    extra = set(_compat(name).__all__) - PYVERBS_NAMES[name]  # type: ignore[attr-defined]
    assert not extra, f"pyverbs.{name} has no {sorted(extra)}"


def test_compat_package_defines_nothing_itself() -> None:
    pkg = importlib.import_module("softverbs.compat.pyverbs")
    # imported submodules become attributes of the package; nothing else may be there
    own = [
        n for n, v in vars(pkg).items() if not n.startswith("__") and not isinstance(v, ModuleType)
    ]
    assert not own


IDENTITIES = [
    ("pyverbs_error", "PyverbsError", softverbs.errors.PyverbsError),
    ("pyverbs_error", "PyverbsRDMAError", softverbs.errors.PyverbsRDMAError),
    ("pyverbs_error", "PyverbsUserError", softverbs.errors.PyverbsUserError),
    ("base", "PyverbsObject", base.PyverbsObject),
    ("base", "PyverbsCM", base.PyverbsCM),
    ("base", "inc_rkey", mr.inc_rkey),
    ("base", "PyverbsRDMAErrno", softverbs.errors.PyverbsRDMAErrno),
    ("device", "Context", device.Context),
    ("device", "get_device_list", device.get_device_list),
    ("device", "translate_mtu", strings.translate_mtu),
    ("pd", "PD", pd.PD),
    ("mr", "MR", mr.MR),
    ("mr", "MW", mr.MW),
    ("cq", "CQ", cq.CQ),
    ("cq", "WC", cq.WC),
    ("qp", "QP", qp.QP),
    ("qp", "QPEx", qp.QPEx),
    ("qp", "QPInitAttrEx", qp.QPInitAttrEx),
    ("addr", "GID", addr.GID),
    ("addr", "AH", addr.AH),
    ("wr", "SendWR", wr.SendWR),
    ("srq", "SRQ", srq.SRQ),
    ("utils", "gid_str", strings.gid_str),
    ("libibverbs_enums", "ibv_qp_type", enums.ibv_qp_type),
    ("libibverbs_enums", "IBV_QPT_RC", enums.IBV_QPT_RC),
    ("libibverbs_enums", "IBV_SEND_DEFER", enums.IBV_SEND_DEFER),
    ("librdmacm_enums", "rdma_port_space", enums.rdma_port_space),
]


@pytest.mark.parametrize(("module", "attr", "expected"), IDENTITIES)
def test_compat_identity(module: str, attr: str, expected: object) -> None:
    assert getattr(_compat(module), attr) is expected


def test_libibverbs_enums_has_every_enum_and_constant() -> None:
    names = set(_compat("libibverbs_enums").__all__)  # type: ignore[attr-defined]
    prefixes = ("IBV_", "_IBV_", "ibv_")
    wanted = {
        n for n, v in vars(enums).items() if n.startswith(prefixes) and isinstance(v, int | type)
    }
    assert wanted <= names
    assert "_IBV_DEVICE_RAW_SCATTER_FCS" in names  # pyverbs' underscore aliases too
    assert not names & {"enum", "Final", "IntEnum", "mtu_to_bytes", "_MTU_BYTES"}


def test_librdmacm_enums_is_only_rdma_cm() -> None:
    names = set(_compat("librdmacm_enums").__all__)  # type: ignore[attr-defined]
    assert {"rdma_port_space", "RDMA_PS_TCP", "rdma_cm_event_type", "RAI_PASSIVE"} <= names
    assert all(n.startswith(("rdma_", "RDMA_", "RAI_")) for n in names)


def test_pyverbs_except_clause_catches_softverbs_errors() -> None:
    err = _compat("pyverbs_error")
    with pytest.raises(err.PyverbsRDMAError) as info:  # type: ignore[attr-defined]
        raise einval("bad")
    assert isinstance(info.value, PyverbsRDMAError)
    assert info.value.error_code == 22


def test_system_pyverbs_leaves_softverbs_pyverbs_off_the_path() -> None:
    """``exec --system-pyverbs``: the child imports the machine's pyverbs, so the
    compat directory is not added, and one inherited from an outer exec is taken off."""
    compat = exec_.compat_dir()
    env = exec_.child_env({"PYTHONPATH": os.pathsep.join([compat, "/x"]), "PATH": "/bin"},
                          "/lib/sv", compat_pyverbs=False)  # fmt: skip
    assert env["PYTHONPATH"] == "/x"
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == "/lib/sv"
    assert "PYTHONPATH" not in exec_.child_env({"PYTHONPATH": compat}, None, compat_pyverbs=False)
    assert exec_.child_env({}, None)["PYTHONPATH"].split(os.pathsep)[0] == compat
