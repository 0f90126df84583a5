"""The extension keeps its C++ runtime private (issue #9).

Loaded after `import torch`, an extension that exported its libstdc++ symbols crashed in its first
std::ostream insertion: torch's libraries define thousands of STB_GNU_UNIQUE symbols (and export
statically linked libstdc++ pieces), the dynamic linker binds unique symbols process-wide, and the
extension's locale facet ids ended up shared with another libstdc++ instance. The build now links
libstdc++/libgcc statically with every symbol local and exports only PyInit__attnkit
(python/CMakeLists.txt, ATTNKIT_PY_PRIVATE_RUNTIME)."""

import shutil
import subprocess
import sys

import pytest

import attnkit as ak


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None,
                    reason="needs Linux and binutils' nm")
def test_extension_exports_only_its_init_function():
    path = ak._attnkit.__file__
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    symbols = [line.split()[-1] for line in out.splitlines() if line.strip()]
    assert symbols == ["PyInit__attnkit"], f"{path} exports {len(symbols)} symbols: {symbols[:8]}"
    needed = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    assert "libstdc++" not in needed, "libstdc++ must be linked privately (statically)"


def test_wrap_after_torch_import():
    torch = pytest.importorskip("torch")
    k = [torch.randn(48, 2, 64, dtype=torch.bfloat16)]  # the #9 crash: first ostream use in wrap
    pool = ak.MHAKVPool.wrap(k, [torch.randn_like(k[0])], page_size=16)
    assert pool.rows == 48 and pool.size == 32
    with pytest.raises(ak.InvalidArgumentError, match=r"v\[0\]"):
        ak.MHAKVPool.wrap(k, [torch.randn(40, 2, 64, dtype=torch.bfloat16)], page_size=16)
