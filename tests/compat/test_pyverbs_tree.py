"""The whole pyverbs module tree rdma-core's tests import, and their environment.

* Every module path rdma-core v59's ``tests/`` imports resolves under
  ``softverbs exec`` (the list is the set of ``import pyverbs...`` lines of
  that suite: names only).
* Vendor trees refuse softverbs devices the way pyverbs refuses a device of
  another vendor; generic features softverbs lacks fail with EOPNOTSUPP.
* ``rdma link show`` (the ``rdma`` command ``exec`` puts on PATH) describes
  softverbs devices in iproute2's shapes.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import softverbs
from softverbs.cli import exec_, rdma
from softverbs.errors import PyverbsRDMAError, PyverbsUserError

SOFTVERBS_HOME = str(Path(softverbs.__file__).resolve().parents[1])

#: The module paths rdma-core v59's tests/ import.
SUITE_MODULES = (
    "addr", "base", "cmid", "cq", "device", "dma_util", "dmabuf", "flow", "fork",
    "libibverbs_enums", "librdmacm_enums", "mem_alloc", "mr", "pd",
    "providers.efa.efa_enums", "providers.efa.efadv", "providers.mlx5.dr_action",
    "providers.mlx5.dr_domain", "providers.mlx5.dr_matcher", "providers.mlx5.dr_rule",
    "providers.mlx5.dr_table", "providers.mlx5.mlx5_enums", "providers.mlx5.mlx5_vfio",
    "providers.mlx5.mlx5dv", "providers.mlx5.mlx5dv_crypto", "providers.mlx5.mlx5dv_dmabuf",
    "providers.mlx5.mlx5dv_flow", "providers.mlx5.mlx5dv_mkey", "providers.mlx5.mlx5dv_objects",
    "providers.mlx5.mlx5dv_sched", "pyverbs_error", "qp", "spec", "srq", "utils", "wq", "wr",
    "xrcd",
)  # fmt: skip


def _env(tmp_path: Path, links: list[dict[str, object]] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("PYTHONPATH", exec_.EXEC_ENV, "SOFTVERBS_SERVICE", "SOFTVERBS_INPROC_DEVICES",
                exec_.PYTHON_ENV):  # fmt: skip
        env.pop(key, None)
    env["SOFTVERBS_SERVICE"] = "0"
    cfg = tmp_path / "links.json"
    if links is not None:
        cfg.write_text(json.dumps({"links": links}))
    env["SOFTVERBS_CONFIG"] = str(cfg)
    env["PYTHONPATH"] = SOFTVERBS_HOME
    return env


def _exec(tmp_path: Path, *cmd: str, links: list[dict[str, object]] | None = None,
          ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run([sys.executable, "-m", "softverbs", "exec", "--", *cmd],
                          env=_env(tmp_path, links), capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_every_module_the_suite_imports_resolves_under_exec(tmp_path: Path) -> None:
    code = "import importlib\n" + "".join(
        f"importlib.import_module('pyverbs.{m}')\n" for m in SUITE_MODULES
    ) + "print('ok')"
    r = _exec(tmp_path, sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


#: Module names older pyverbs releases had (until rdma-core v58), which public examples use.
LEGACY_MODULES = {"enums": "libibverbs_enums", "cm_enums": "librdmacm_enums"}


def test_legacy_module_names_resolve_under_exec(tmp_path: Path) -> None:
    code = (
        "import importlib\n"
        "import pyverbs.enums as e\n"
        "from pyverbs.enums import IBV_QPT_RC, ibv_qp_type\n"
        f"for old, new in {LEGACY_MODULES!r}.items():\n"
        "    a = importlib.import_module('pyverbs.' + old)\n"
        "    b = importlib.import_module('pyverbs.' + new)\n"
        "    assert a.__all__ == b.__all__ and a.__all__, old\n"
        "    assert all(getattr(a, n) is getattr(b, n) for n in b.__all__), old\n"
        "print(e.IBV_QPT_RC == IBV_QPT_RC == ibv_qp_type.IBV_QPT_RC == 2)"
    )
    r = _exec(tmp_path, sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def test_vendor_contexts_refuse_softverbs_devices() -> None:
    from softverbs.compat.pyverbs.providers.efa import efadv
    from softverbs.compat.pyverbs.providers.mlx5 import mlx5dv

    with pytest.raises(PyverbsUserError, match="This is not an MLX5 device"):
        mlx5dv.Mlx5Context(mlx5dv.Mlx5DVContextAttr(), name="sv0")  # type: ignore[attr-defined]
    ctx = efadv.EfaContext(name="sv0")  # type: ignore[attr-defined]
    try:  # as in pyverbs: it opens, and the EFA query fails
        with pytest.raises(PyverbsRDMAError) as info:
            ctx.query_efa_device()
        assert info.value.error_code == errno.EOPNOTSUPP
    finally:
        ctx.close()
    with pytest.raises(PyverbsRDMAError) as info:
        mlx5dv.Mlx5QP(ctx, None)  # type: ignore[attr-defined]
    assert info.value.error_code == errno.EOPNOTSUPP


def test_vendor_enums_are_the_headers_values() -> None:
    from softverbs.compat.pyverbs.providers.mlx5 import mlx5_enums

    # mlx5dv.h: MLX5_SEND_WQE_BB = 64, MLX5_CQE_INVALID = 15
    assert mlx5_enums.MLX5_SEND_WQE_BB == 64  # type: ignore[attr-defined]
    assert mlx5_enums.MLX5_CQE_INVALID == 15  # type: ignore[attr-defined]


def test_exec_puts_the_rdma_command_first_on_path() -> None:
    env = exec_.child_env({"PATH": "/usr/bin:/bin"})
    assert env["PATH"].split(os.pathsep)[0] == exec_.bin_dir()
    assert os.access(os.path.join(exec_.bin_dir(), "rdma"), os.X_OK)
    assert env[exec_.PYTHON_ENV] == sys.executable


def test_rdma_link_show_json_for_an_in_process_device(tmp_path: Path) -> None:
    r = _exec(tmp_path, "rdma", "link", "show", "-j")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows == [{"ifindex": 0, "ifname": "sv0", "port": 1, "state": "ACTIVE",
                     "physical_state": "LINK_UP"}]  # fmt: skip
    # no netdev: an in-process device has none, as an InfiniBand port


def test_rdma_link_show_maps_a_udp_device_to_its_netdev(tmp_path: Path) -> None:
    links: list[dict[str, object]] = [{"name": "svlo", "netdev": "lo"}]
    r = _exec(tmp_path, "rdma", "link", "show", "-j", links=links)
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[-1]
    assert row["ifname"] == "svlo" and row["netdev"] == "lo"
    assert row["netdev_index"] == 1 or isinstance(row["netdev_index"], int)
    text = _exec(tmp_path, "rdma", "link", links=links).stdout
    assert "link svlo/1 state ACTIVE physical_state LINK_UP netdev lo" in text


def test_rdma_answers_only_what_it_can(tmp_path: Path) -> None:
    assert _exec(tmp_path, "rdma", "link", "add", "x").returncode == 1
    assert _exec(tmp_path, "rdma", "statistic").returncode == 1
    assert _exec(tmp_path, "rdma", "link", "show", "nosuchdev").returncode == 1
    dev = _exec(tmp_path, "rdma", "dev", "-j")
    assert dev.returncode == 0, dev.stderr
    assert json.loads(dev.stdout)[0]["ifname"] == "sv0"


def test_link_rows_of_specs() -> None:
    class Spec:
        def __init__(self, name: str, kind: str, netdev: str = "") -> None:
            self.name, self.kind, self.netdev, self.addrs = name, kind, netdev, ()

    rows = rdma.link_rows([Spec("a", "inproc"), Spec("b", "udp", "lo")])
    assert "netdev" not in rows[0] and rows[1]["netdev"] == "lo" and rows[1]["ifindex"] == 1
