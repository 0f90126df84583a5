"""Library errors surface as attnkit.Error subclasses carrying the library's message."""

import numpy as np
import pytest

import attnkit as ak


def small_setup(page_size=4, kv_dtype="f32"):
    pool = ak.MHAKVPool(1, 8 * page_size, page_size, 2, 64, dtype=kv_dtype)
    table = ak.ReqToTokenPool(4, 64)
    return pool, table


def test_error_hierarchy_and_codes():
    assert issubclass(ak.Error, RuntimeError)
    assert issubclass(ak.InvalidArgumentError, ak.Error)
    assert issubclass(ak.InvalidArgumentError, ValueError)
    assert issubclass(ak.NotFoundError, LookupError)
    assert issubclass(ak.OutOfMemoryError, MemoryError)
    assert ak.InvalidArgumentError.code == "invalid_argument"
    assert ak.UnsupportedError.code == "unsupported"
    assert ak.NotBuiltError.code == "not_built"


def test_invalid_pool_config_names_the_field_and_value():
    with pytest.raises(ak.InvalidArgumentError) as info:
        ak.MHAKVPool(1, 10, 4, 2, 64)
    assert str(info.value) == "KVPoolConfig.size 10 must be a positive multiple of page_size 4"
    assert info.value.code == "invalid_argument"
    assert isinstance(info.value, ValueError)


def test_unknown_backend_lists_valid_names():
    pool, table = small_setup()
    with pytest.raises(ak.NotFoundError) as info:
        ak.create_backend("no_such_backend", kv_pool=pool, req_to_token_pool=table,
                          num_q_heads=4, q_dtype="f32")
    message = str(info.value)
    assert 'attention backend "no_such_backend" is not known' in message
    assert "torch_native" in message and "triton" in message


def test_backend_not_built_or_wrong_platform_says_why():
    pool, table = small_setup()
    with pytest.raises((ak.NotBuiltError, ak.UnsupportedError)) as info:
        ak.create_backend("fa3", kv_pool=pool, req_to_token_pool=table, num_q_heads=4,
                          q_dtype="f32")
    assert "fa3" in str(info.value)


def test_page_allocator_out_of_pages():
    allocator = ak.PageAllocator(2, 4)
    with pytest.raises(ak.OutOfMemoryError) as info:
        allocator.alloc_extend([0], [100], [-1])
    assert "page" in str(info.value)
    assert allocator.available_pages == 2  # nothing allocated on error


def test_forward_batch_rejects_int64_lengths_naming_the_field():
    pool, table = small_setup()
    row = table.alloc()
    with pytest.raises(ak.InvalidArgumentError) as info:
        ak.ForwardBatch("extend", np.array([row], dtype=np.int32), np.array([3], dtype=np.int64),
                        np.array([4, 5, 6], dtype=np.int64), table, pool,
                        extend_prefix_lens=np.zeros(1, dtype=np.int32),
                        extend_seq_lens=np.array([3], dtype=np.int32))
    assert "ForwardBatch.seq_lens" in str(info.value)
    assert "int64" in str(info.value)


def _extend_setup(pool=None):
    # One 3-token extend on a torch_native backend, planned; `pool`: a wrapped pool to use instead
    # of small_setup's (the same shape: 32 rows of 2 x 64, page 4).
    if pool is None:
        pool, table = small_setup()
    else:
        table = ak.ReqToTokenPool(4, 64)
    backend = ak.create_backend("torch_native", kv_pool=pool, req_to_token_pool=table,
                                num_q_heads=4, q_dtype="f32")
    row = table.alloc()
    slots = np.array([4, 5, 6], dtype=np.int64)
    table.write(row, 0, slots)
    batch = ak.ForwardBatch("extend", np.array([row], dtype=np.int32),
                            np.array([3], dtype=np.int32), slots, table, pool,
                            extend_prefix_lens=np.zeros(1, dtype=np.int32),
                            extend_seq_lens=np.array([3], dtype=np.int32))
    backend.init_forward_metadata(batch)
    return backend, batch, ak.AttentionLayer(4, 2, 64)


def test_forward_with_wrong_q_shape_names_q():
    backend, batch, layer = _extend_setup()
    q = np.ones((3, 5, 64), dtype=np.float32)  # 5 heads, the layer says 4
    k = np.ones((3, 2, 64), dtype=np.float32)
    out = np.full((3, 4, 64), np.nan, dtype=np.float32)
    with pytest.raises(ak.InvalidArgumentError) as info:
        backend.forward_extend(q, k, k, out, layer, batch)
    assert str(info.value).startswith("q:")
    assert np.isnan(out).all()  # checks happen before anything runs


def test_q_scale_is_a_layer_field_checked_before_anything_runs():
    # AttentionLayer.q_scale (an e4m3 q's scale, fa3's FP8 prefill): a keyword and a property,
    # checked like k_scale (finite, > 0) whatever q's dtype; torch_native takes no e4m3 q.
    backend, batch, _ = _extend_setup()
    layer = ak.AttentionLayer(4, 2, 64, q_scale=0.25)
    assert layer.q_scale == 0.25
    layer.q_scale = 0.0
    q = np.ones((3, 4, 64), dtype=np.float32)
    k = np.ones((3, 2, 64), dtype=np.float32)
    out = np.full((3, 4, 64), np.nan, dtype=np.float32)
    with pytest.raises(ak.InvalidArgumentError) as info:
        backend.forward_extend(q, k, k, out, layer, batch)
    assert "layer.q_scale 0 must be finite and > 0" in str(info.value)
    assert np.isnan(out).all()
    layer.q_scale = 1.0
    backend.forward_extend(q, k, k, out, layer, batch)
    assert np.isfinite(out).all()


def test_wrap_rejects_mismatched_layer_buffer():
    k = [np.zeros((12, 2, 64), np.float32), np.zeros((12, 2, 32), np.float32)]
    v = [np.zeros((12, 2, 64), np.float32), np.zeros((12, 2, 64), np.float32)]
    with pytest.raises(ak.InvalidArgumentError) as info:
        ak.MHAKVPool.wrap(k, v, page_size=4)
    assert str(info.value).startswith("k[1]: expected shape [12, 2, 64]")


def test_set_kv_rejects_reserved_page_zero_slot():
    pool, _ = small_setup()
    k = np.ones((1, 2, 64), np.float32)
    with pytest.raises(ak.InvalidArgumentError) as info:
        pool.set_kv(0, np.array([1], dtype=np.int64), k, k)
    assert "page 0 is reserved" in str(info.value)
    # CPU pools reject bad slots in set_kv itself: the device slot guard has nothing to report.
    assert pool.check_device_errors() is None


def test_bad_device_and_dtype_arguments():
    with pytest.raises(ak.InvalidArgumentError, match='device "gpu7"'):
        ak.ReqToTokenPool(2, 8, device="gpu7")
    with pytest.raises(ak.InvalidArgumentError, match="dtype"):
        ak.MHAKVPool(1, 8, 4, 2, 64, dtype="float128")


def test_resolve_errors_name_the_flag():
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
             "num_attention_heads": 4, "num_key_value_heads": 2}
    with pytest.raises(ak.InvalidArgumentError) as info:
        ak.resolve(llama, "sm90", attention_backend="bogus")
    assert '--attention-backend "bogus"' in str(info.value)
    with pytest.raises(ak.InvalidArgumentError, match="unknown server argument"):
        ak.resolve(llama, "sm90", attention_backendd="fa3")


def test_resolve_wrong_types_name_the_flag():
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
             "num_attention_heads": 4, "num_key_value_heads": 2}
    for flag, value, expected in [("page_size", 16.0, "an int"), ("page_size", "16", "an int"),
                                  ("tp_size", 2**31, "an int in the int32 range"),
                                  ("disable_cuda_graph", 1, "True or False"),
                                  ("attention_backend", 3, "a str")]:
        with pytest.raises(ak.InvalidArgumentError) as info:
            ak.resolve(llama, "sm90", **{flag: value})
        assert str(info.value).startswith(f"resolve: {flag} must be {expected}"), str(info.value)
    # NumPy integers are integers (as for every other int parameter of the module).
    assert ak.resolve(llama, "sm90", page_size=np.int64(16)).page_size == 16
    # None means the default for the dtype flag, as it does for the optional ones.
    assert ak.resolve(llama, "sm90", kv_cache_dtype=None).kv_dtype == \
        ak.resolve(llama, "sm90").kv_dtype


def test_stream_out_of_range_names_stream():
    pool, table = small_setup()
    for stream in (-1, 2**70):
        with pytest.raises(ak.InvalidArgumentError, match="stream must be a cudaStream_t"):
            ak.create_backend("torch_native", kv_pool=pool, req_to_token_pool=table,
                              num_q_heads=4, q_dtype="f32", stream=stream)


def test_strided_tree_mask_is_refused():
    # The kernels read the mask as one flat byte array: a strided view of the same bits (here
    # every other byte of a larger buffer) attended with the wrong bits before it was refused.
    pool, table = small_setup(kv_dtype="f32")
    prefix, drafts = 3, 2
    row = table.alloc()
    slots = np.arange(4, 4 + prefix + drafts, dtype=np.int64)
    table.write(row, 0, slots)
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 1]], np.uint8).reshape(-1)
    big = np.zeros(2 * mask.size, np.uint8)
    big[::2] = mask
    spec = ak.SpecInfo(drafts, topk=2, custom_mask=big[::2],
                       mask_indptr=np.array([0, drafts * (prefix + drafts)], np.int64))
    with pytest.raises(ak.InvalidArgumentError,
                       match="ForwardBatch.spec.custom_mask: expected a contiguous array"):
        ak.ForwardBatch("target_verify", np.array([row], np.int32), np.array([prefix], np.int32),
                        slots[prefix:].copy(), table, pool, spec=spec)


def test_failed_graph_capture_keeps_no_array():
    import gc
    import weakref

    class Tracked(np.ndarray):
        pass

    pool, table = small_setup()
    backend = ak.create_backend("torch_native", kv_pool=pool, req_to_token_pool=table,
                                num_q_heads=4, q_dtype="f32")
    probe = np.ones(4, np.int32).view(Tracked)
    ref = weakref.ref(probe)
    with pytest.raises(ak.UnsupportedError):
        backend.init_forward_metadata_capture_cuda_graph(1, 1, probe, probe)
    del probe
    gc.collect()
    assert ref() is None  # a capture that failed pins nothing for the backend's lifetime


def test_wrap_stacked_layers_with_a_negative_stride():
    # One [layers, rows, heads, dim] array with its layers in reverse order (each layer
    # contiguous): each layer's address was rounded up by a byte and the wrap refused as
    # "k[1] and k[0] share memory".
    layers, rows = 3, 20
    k = np.zeros((layers, rows, 2, 64), np.float32)[::-1]
    v = np.zeros((layers, rows, 2, 64), np.float32)[::-1]
    pool = ak.MHAKVPool.wrap(k, v, page_size=4)
    assert pool.num_layers == layers
    x = np.arange(2 * 64, dtype=np.float32).reshape(1, 2, 64)
    pool.set_kv(1, np.array([5], np.int64), x, 2 * x)
    np.testing.assert_array_equal(k[1][5], x[0])  # layer 1 is the caller's k[1]
    np.testing.assert_array_equal(v[1][5], 2 * x[0])
    assert not k[0].any() and not k[2].any()


def test_pool_buffer_accessors_name_layer_and_dtype():
    pool, _ = small_setup()
    with pytest.raises(ak.InvalidArgumentError,
                       match=r"k_buffer: layer 5 is outside the pool's layers \[0, 1\)"):
        pool.k_buffer(5)
    with pytest.raises(ak.InvalidArgumentError, match="k_scale_buffer: a f32 pool has no such"):
        pool.k_scale_buffer(0)
    assert np.asarray(pool.k_buffer(0)).shape == (8 * 4 + 4, 2, 64)


def test_read_only_inputs_are_accepted():
    # q, k and v are only read: read-only NumPy arrays (np.broadcast_to, a frozen buffer) were
    # refused as "incompatible function arguments". The output matches writable inputs'.
    rng = np.random.default_rng(3)
    q = rng.standard_normal((3, 4, 64)).astype(np.float32)
    k = rng.standard_normal((3, 2, 64)).astype(np.float32)
    v = np.broadcast_to(rng.standard_normal((1, 2, 64)).astype(np.float32), (3, 2, 64))
    assert not v.flags.writeable
    frozen_q = q.copy()
    frozen_q.setflags(write=False)
    backend, batch, layer = _extend_setup()
    out = np.full((3, 4, 64), np.nan, dtype=np.float32)
    backend.forward_extend(frozen_q, k, v, out, layer, batch)
    backend2, batch2, _ = _extend_setup()
    expected = np.full((3, 4, 64), np.nan, dtype=np.float32)
    backend2.forward_extend(q, k, np.ascontiguousarray(v), expected, layer, batch2)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out, expected)


def test_read_only_outputs_are_refused_by_name():
    backend, batch, layer = _extend_setup()
    q = np.ones((3, 4, 64), dtype=np.float32)
    k = np.ones((3, 2, 64), dtype=np.float32)
    out = np.full((3, 4, 64), np.nan, dtype=np.float32)
    out.setflags(write=False)
    with pytest.raises(ak.InvalidArgumentError,
                       match="out: the array is read-only; attnkit writes the attention output"):
        backend.forward_extend(q, k, k, out, layer, batch)
    writable = np.full((3, 4, 64), np.nan, dtype=np.float32)
    lse = np.zeros((3, 4), dtype=np.float32)
    lse.setflags(write=False)
    with pytest.raises(ak.InvalidArgumentError, match="lse: the array is read-only"):
        backend.forward_extend(q, k, k, writable, layer, batch, lse=lse)
    with pytest.raises(ak.InvalidArgumentError, match="out: expected a writable DLPack array"):
        backend.forward_extend(q, k, k, [1.0], layer, batch)
    assert np.isnan(writable).all()  # refused before anything ran


def test_wrap_refuses_read_only_kv_buffers_by_name():
    k = np.zeros((12, 2, 64), np.float32)
    frozen = np.zeros((12, 2, 64), np.float32)
    frozen.setflags(write=False)
    with pytest.raises(ak.InvalidArgumentError,
                       match=r"v\[0\]: the array is read-only; attnkit writes the KV cache"):
        ak.MHAKVPool.wrap([k], [frozen], page_size=4)
    stacked = np.zeros((1, 12, 2, 64), np.float32)
    stacked.setflags(write=False)
    with pytest.raises(ak.InvalidArgumentError, match="k: the array is read-only"):
        ak.MHAKVPool.wrap(stacked, stacked, page_size=4)


def test_broadcast_index_arrays_are_refused_before_any_copy():
    # A stride-0 array of 2^31 + 3 elements is a few bytes; copying it to the host ints took 23 GB
    # before validate() refused the stride. Now the copy itself refuses it.
    pool, table = small_setup()
    n = 2**31 + 3
    i32 = np.broadcast_to(np.int32(1), (n,))
    i64 = np.broadcast_to(np.int64(4), (n,))
    with pytest.raises(ak.InvalidArgumentError, match="a broadcast \\(stride 0\\) array"):
        ak.ForwardBatch("decode", i32, i32, i64, table, pool)
    with pytest.raises(ak.InvalidArgumentError, match="slots: a broadcast"):
        table.write(table.alloc(), 0, i64)


def test_out_over_the_kv_pool_walking_backwards_is_refused():
    # out with a negative stride spans the bytes below its data pointer: ending just past the
    # cached k rows, it was taken and overwrote them.
    pool_v = np.zeros((40, 2, 64), np.float32)
    store = np.zeros((60, 4, 64), np.float32)  # pool k of 32 rows, then room past it
    store_k = store.reshape(-1)[: 32 * 2 * 64].reshape(32, 2, 64)
    backend, batch, layer = _extend_setup(
        ak.MHAKVPool.wrap([store_k], [pool_v[:32]], page_size=4))
    q = np.ones((3, 4, 64), np.float32)
    k = np.ones((3, 2, 64), np.float32)
    flat = store.reshape(-1, 4, 64)  # rows of 4 x 64 floats; the pool's k ends at row 16
    backwards = flat[17:14:-1]  # rows 17, 16, 15: row 15 is inside the pool's k
    before = store_k.copy()
    with pytest.raises(ak.InvalidArgumentError, match="overlaps the KV pool's k\\[0\\] buffer"):
        backend.forward_extend(q, k, k, backwards, layer, batch, save_kv=False)
    np.testing.assert_array_equal(store_k, before)


def test_set_kv_from_the_rows_it_writes_is_refused():
    # k[7:11] into slots 8..11 read rows it had already overwritten ([3, 3, 3, 3]).
    pool, _ = small_setup()
    k = np.from_dlpack(pool.k_buffer(0))
    k[4:12] = np.arange(8, dtype=np.float32)[:, None, None]
    before = k.copy()
    with pytest.raises(ak.InvalidArgumentError, match="set_kv k f32\\[4, 2, 64\\]"):
        pool.set_kv(0, np.array([8, 9, 10, 11]), k[7:11], np.zeros((4, 2, 64), np.float32))
    np.testing.assert_array_equal(k, before)
    pool.set_kv(0, np.array([8, 9, 10, 11]), k[7:11].copy(), np.zeros((4, 2, 64), np.float32))
    np.testing.assert_array_equal(k[8:12, 0, 0], [3, 4, 5, 6])


def test_empty_arrays_pass_the_layout_checks():
    # numpy gives zero-size arrays stride 0: an empty set_kv was refused as "the innermost stride
    # must be 1, got 0".
    pool, _ = small_setup()
    empty = np.zeros((0, 2, 64), np.float32)
    pool.set_kv(0, np.zeros(0, np.int64), empty, empty)


def _threaded_decode_setup(seed):
    """An intel_amx decode of 4 requests x 2000 keys (f32; request r on pool slots
    16 + 2000 r .. 16 + 2000 r + 1999, shuffled), planned: long enough for threads to overlap.
    Returns (pool, backend, batch, layer, q, rng)."""
    pool = ak.MHAKVPool(1, 8192, 16, 2, 64, dtype="f32")
    table = ak.ReqToTokenPool(8, 4096)
    backend = ak.create_backend("intel_amx", kv_pool=pool, req_to_token_pool=table,
                                num_q_heads=8, q_dtype="f32")
    seq = 2000
    rows = [table.alloc() for _ in range(4)]
    # Each request's slots its own (a new token's slot read as another request's cached key is
    # refused on CPU pools); 7 is coprime with 2000, so i * 7 % 2000 shuffles them.
    for r, row in enumerate(rows):
        table.write(row, 0, np.arange(seq, dtype=np.int64) * 7 % seq + 16 + seq * r)
    rng = np.random.default_rng(seed)
    np.from_dlpack(pool.k_buffer(0))[:] = rng.standard_normal((8208, 2, 64)).astype(np.float32)
    np.from_dlpack(pool.v_buffer(0))[:] = rng.standard_normal((8208, 2, 64)).astype(np.float32)
    # The new tokens' slots are the rows' last entries (ForwardBatch checks out_cache_loc against
    # req_to_token on CPU pools).
    last = np.array([(seq - 1) * 7 % seq + 16 + seq * r for r in range(4)], dtype=np.int64)
    batch = ak.ForwardBatch("decode", np.array(rows, dtype=np.int32),
                            np.full(4, seq, dtype=np.int32), last, table, pool)
    backend.init_forward_metadata(batch)
    layer = ak.AttentionLayer(8, 2, 64)
    q = rng.standard_normal((4, 8, 64)).astype(np.float32)
    return pool, backend, batch, layer, q, rng


def _run_threads(targets):
    import threading

    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _decode_calls(n, backend, q, layer, batch, expected, refused, exact, wrong, until=None):
    """Up to n forward_decode calls (fewer once until() holds), each followed by a 0.1 ms sleep that
    gives the GIL to the other threads: a refusal's message goes to `refused`; an output equal to
    expected[i] appends i to `exact`, any other output counts in `wrong`."""
    import time

    out = np.empty((4, 8, 64), np.float32)
    for _ in range(n):
        if until is not None and until():
            break
        try:
            backend.forward_decode(q, None, None, out, layer, batch, save_kv=False)
        except ak.InvalidArgumentError as e:
            refused.append(str(e))
        else:
            match = [i for i, x in enumerate(expected) if np.array_equal(out, x)]
            if match:
                exact.append(match[0])
            else:
                wrong.append(1)
        time.sleep(1e-4)


def test_a_backend_runs_one_call_at_a_time():
    # Two threads inside one backend shared its plan and scratch: intel_amx gave wrong outputs. A
    # call made while another thread is inside now raises; every call that runs is exact.
    _, backend, batch, layer, q, _ = _threaded_decode_setup(5)
    expected = np.empty((4, 8, 64), np.float32)
    backend.forward_decode(q, None, None, expected, layer, batch, save_kv=False)
    refused, exact, wrong = [], [], []

    def work():
        _decode_calls(100, backend, q, layer, batch, [expected], refused, exact, wrong)

    _run_threads([work] * 4)
    assert not wrong, f"{len(wrong)} of {len(wrong) + len(exact)} concurrent calls were wrong"
    assert exact
    for e in refused:
        assert "another thread is inside a call of this backend" in e


def test_set_kv_and_forwards_of_one_pool_do_not_overlap():
    # Backend calls were one at a time per backend, but KVPool.set_kv from another thread could
    # rewrite rows under a running forward (both release the GIL). Now a set_kv made while a
    # forward over its pool runs raises, and a forward made while a set_kv runs raises: every
    # forward sees the rows of one set_kv or the other, never a mix.
    import threading
    import time

    pool, backend, batch, layer, q, rng = _threaded_decode_setup(9)
    # Two states of 1024 rows request 0 reads (slots 16..1039): set_kv alternates them.
    loc = np.arange(16, 1040, dtype=np.int64)
    states = [(rng.standard_normal((1024, 2, 64)).astype(np.float32),
               rng.standard_normal((1024, 2, 64)).astype(np.float32)) for _ in range(2)]
    expected = []
    for k, v in states:
        pool.set_kv(0, loc, k, v)
        out = np.empty((4, 8, 64), np.float32)
        backend.forward_decode(q, None, None, out, layer, batch, save_kv=False)
        expected.append(out)
    assert not np.array_equal(expected[0], expected[1])
    refused, exact, wrong, written = [], [], [], []
    stop = threading.Event()
    deadline = time.monotonic() + 20

    def enough():  # both states seen by forwards, and set_kv calls that ran between them
        return exact.count(0) >= 3 and exact.count(1) >= 3 and len(written) >= 10

    def forwards():
        _decode_calls(10**6, backend, q, layer, batch, expected, refused, exact, wrong,
                      until=lambda: enough() or time.monotonic() > deadline)
        stop.set()

    def writes():
        i = 0
        while not stop.is_set():
            try:
                pool.set_kv(0, loc, *states[i % 2])
            except ak.InvalidArgumentError as e:
                refused.append(str(e))
            else:
                written.append(i % 2)
                i += 1
            time.sleep(1e-4)

    _run_threads([forwards, writes])
    assert not wrong, f"{len(wrong)} of {len(wrong) + len(exact)} forwards saw mixed rows"
    assert enough(), (f"in 20 s: forwards saw state 0 {exact.count(0)} / state 1 "
                      f"{exact.count(1)} times, {len(written)} set_kv ran, {len(refused)} refused")
    for e in refused:
        assert ("KVPool.set_kv: another thread is inside a forward over this pool" in e or
                "Backend.forward_decode: another thread is inside KVPool.set_kv" in e), e


@pytest.mark.parametrize("backend_name", ["torch_native", "intel_amx"])
def test_request_table_does_not_change_under_a_forward(backend_name):
    # ReqToTokenPool.write / free from another thread changed rows under a running forward (which
    # releases the GIL): a row written past the pool segfaulted, two valid states gave mixed
    # outputs. Now write / free raise while a backend call reads the table (free shares write's
    # check); every forward that runs sees one state or the other.
    import threading
    import time

    pool = ak.MHAKVPool(1, 8192, 16, 2, 64, dtype="f32")
    table = ak.ReqToTokenPool(2, 4096)
    backend = ak.create_backend(backend_name, kv_pool=pool, req_to_token_pool=table,
                                num_q_heads=8, q_dtype="f32")
    rng = np.random.default_rng(12)
    np.from_dlpack(pool.k_buffer(0))[:] = rng.standard_normal((8208, 2, 64)).astype(np.float32)
    np.from_dlpack(pool.v_buffer(0))[:] = rng.standard_normal((8208, 2, 64)).astype(np.float32)
    row = table.alloc()
    states = [np.arange(16, 4016, dtype=np.int64)]
    states.append(states[0].copy())
    states[1][:-1] += 4000  # the same new-token slot, other cached slots
    table.write(row, 0, states[0])
    batch = ak.ForwardBatch("decode", np.array([row], np.int32), np.array([4000], np.int32),
                            states[0][-1:], table, pool)
    layer = ak.AttentionLayer(8, 2, 64)
    q = rng.standard_normal((1, 8, 64)).astype(np.float32)
    expected = []
    for s in states:
        table.write(row, 0, s)
        backend.init_forward_metadata(batch)
        out = np.empty((1, 8, 64), np.float32)
        backend.forward_decode(q, None, None, out, layer, batch, save_kv=False)
        expected.append(out)
    assert not np.array_equal(expected[0], expected[1])
    table.write(row, 0, states[0])
    backend.init_forward_metadata(batch)
    refused, written, wrong, seen = [], [], [], []
    stop = threading.Event()

    def forwards():
        out = np.empty((1, 8, 64), np.float32)
        deadline = time.monotonic() + 20
        try:
            while len(refused) < 20 and time.monotonic() < deadline:
                backend.forward_decode(q, None, None, out, layer, batch, save_kv=False)
                match = [i for i, x in enumerate(expected) if np.array_equal(out, x)]
                (seen if match else wrong).append(1)
        finally:
            stop.set()  # a failing forward must not leave writes() spinning

    def writes():
        i = 0
        while not stop.is_set():
            try:
                table.write(row, 0, states[i % 2])
            except ak.InvalidArgumentError as e:
                refused.append(str(e))
            else:
                written.append(i)
            i += 1

    _run_threads([forwards, writes])
    assert not wrong, f"{len(wrong)} of {len(wrong) + len(seen)} forwards saw a changed row"
    assert len(refused) >= 20, f"{len(refused)} writes refused, {len(written)} ran"
    for e in refused:
        assert ("ReqToTokenPool.write: another thread is inside a backend call that reads this "
                "table" in e), e


def test_host_copies_must_hold_their_arrays_values():
    # A ForwardBatch's *_host lists contradicting its host-memory arrays ran another batch than
    # the arrays describe (CPU backends compute from the host lists), silently.
    pool = ak.MHAKVPool(1, 64, 1, 2, 64, dtype="f32")
    table = ak.ReqToTokenPool(4, 64)
    r1, r2 = table.alloc(), table.alloc()
    table.write(r1, 0, np.array([8, 9, 10], np.int64))
    table.write(r2, 0, np.array([4, 5, 6], np.int64))
    with pytest.raises(ak.InvalidArgumentError,
                       match=r"ForwardBatch.req_pool_indices_host\[0\] = 1 but "
                             r"req_pool_indices\[0\] = 2: a host copy must hold"):
        ak.ForwardBatch(
            "extend", np.array([r2], np.int32), np.array([3], np.int32),
            np.array([4, 5, 6], np.int64), table, pool,
            extend_prefix_lens=np.zeros(1, np.int32), extend_seq_lens=np.array([3], np.int32),
            req_pool_indices_host=[r1])


def test_mode_is_a_name_or_a_forward_mode_not_an_int():
    # True / 0 / 5 were taken as DECODE / EXTEND / DRAFT_EXTEND.
    table = ak.ReqToTokenPool(2, 64)
    pool = ak.MHAKVPool(1, 64, 1, 2, 64, dtype="f32")
    row = table.alloc()
    table.write(row, 0, np.array([4], np.int64))
    for mode in (True, 0, 5):
        with pytest.raises(ak.InvalidArgumentError,
                           match="mode must be a string or attnkit.ForwardMode, got"):
            ak.ForwardBatch(mode, np.array([row], np.int32), np.array([1], np.int32),
                            np.array([4], np.int64), table, pool)
    for mode in ("decode", ak.ForwardMode.DECODE):
        ak.ForwardBatch(mode, np.array([row], np.int32), np.array([1], np.int32),
                        np.array([4], np.int64), table, pool)


def test_torch_native_context_heads_and_topk_are_checked():
    # torch_native took num_q_heads -4 (and 3 over 2 kv heads, speculative_topk -3) at creation.
    table = ak.ReqToTokenPool(2, 64)
    pool = ak.MHAKVPool(1, 64, 1, 2, 64, dtype="f32")
    for kwargs, needle in (({"num_q_heads": -4}, r"ctx heads -4/2"),
                           ({"num_q_heads": 3}, r"ctx heads 3/2: need num_q_heads a multiple"),
                           ({"num_q_heads": 4, "speculative_topk": -3},
                            r"ctx.speculative_topk -3 must be >= 0")):
        with pytest.raises(ak.InvalidArgumentError, match=needle):
            ak.create_backend("torch_native", kv_pool=pool, req_to_token_pool=table,
                              q_dtype="f32", **kwargs)
    ak.create_backend("torch_native", kv_pool=pool, req_to_token_pool=table, num_q_heads=4,
                      q_dtype="f32")


def test_batch_stream_accepts_none_like_the_constructor():
    # ForwardBatch(stream=None) meant the backend's stream, but `batch.stream = None` raised a bare
    # "incompatible function arguments" TypeError.
    backend, batch, layer = _extend_setup()
    batch.stream = 5
    assert batch.stream == 5
    batch.stream = None
    assert batch.stream == 0
    with pytest.raises(ak.InvalidArgumentError, match="stream must be a cudaStream_t handle"):
        batch.stream = -1
