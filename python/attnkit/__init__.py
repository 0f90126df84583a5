"""attnkit: the attention-backend layer of an LLM inference server, from Python.

Arrays are any object with ``__dlpack__`` (torch tensors on CPU or CUDA, NumPy arrays) and are
borrowed zero-copy. Library errors raise :class:`attnkit.Error` subclasses carrying the library's
message (``InvalidArgumentError`` is also a ``ValueError``). CUDA work runs on the stream you pass
as an int: ``torch.cuda.current_stream().cuda_stream``. See docs/python.md.
"""

from ._attnkit import (  # noqa: F401
    AttentionLayer,
    Backend,
    CudaError,
    DeviceInfo,
    Error,
    ForwardBatch,
    ForwardMode,
    InternalError,
    InvalidArgumentError,
    KVPool,
    MHAKVPool,
    MLAKVPool,
    ModelConfig,
    NotBuiltError,
    NotFoundError,
    OutOfMemoryError,
    PageAllocator,
    ReqToTokenPool,
    Selection,
    SpecInfo,
    UnsupportedError,
    __version__,
    backend_names,
    built_with_cuda,
    create_backend,
    device_info,
    last_locs,
    linear_attn_backends,
    load_model_config,
    matrix,
    parse_model_config,
    resolve,
    select,
    virtual_device_names,
)


def built_backends(platform=None):
    """Names of the backends compiled into this build, optionally only those running on
    ``platform`` ("CPU" or "CUDA")."""
    names = []
    for row in matrix():
        if not row["built"]:
            continue
        if platform is not None and platform.lower() not in (p.lower() for p in row["platforms"]):
            continue
        names.append(row["name"])
    return names
