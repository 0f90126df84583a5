"""Zero-copy pools, the request table, the page allocator, resolve() and matrix()."""

import numpy as np
import pytest

import attnkit as ak

LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
         "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
         "torch_dtype": "bfloat16"}


def test_library_pool_views_alias_the_pool_memory():
    pool = ak.MHAKVPool(2, 16, 4, 2, 64, v_head_dim=32, dtype="f32")
    assert (pool.rows, pool.size, pool.page_size, pool.num_layers) == (20, 16, 4, 2)
    assert pool.owns_memory
    k = np.from_dlpack(pool.k_buffer(1))
    v = np.from_dlpack(pool.v_buffer(1))
    assert k.shape == (20, 2, 64) and v.shape == (20, 2, 32) and k.dtype == np.float32
    rng = np.random.default_rng(0)
    new_k = rng.standard_normal((2, 2, 64)).astype(np.float32)
    new_v = rng.standard_normal((2, 2, 32)).astype(np.float32)
    pool.set_kv(1, np.array([5, 9], dtype=np.int64), new_k, new_v)
    np.testing.assert_array_equal(k[[5, 9]], new_k)  # the earlier view sees the write
    np.testing.assert_array_equal(v[[5, 9]], new_v)
    del pool  # the exported views keep the pool alive
    np.testing.assert_array_equal(k[[5, 9]], new_k)


def test_wrapped_pool_writes_into_caller_buffers():
    layers = np.full((3, 12, 2, 16), np.nan, dtype=np.float16)  # one [L, rows, H, D] array
    values = np.full((3, 12, 2, 16), np.nan, dtype=np.float16)
    pool = ak.MHAKVPool.wrap(layers, values, page_size=4)
    assert not pool.owns_memory and pool.dtype == "f16" and pool.size == 8
    k = np.arange(2 * 2 * 16, dtype=np.float32).reshape(2, 2, 16) / 7
    pool.set_kv(2, np.array([4, 11], dtype=np.int64), k, -k)
    np.testing.assert_array_equal(layers[2, [4, 11]], k.astype(np.float16))
    np.testing.assert_array_equal(values[2, [4, 11]], (-k).astype(np.float16))
    assert np.isnan(layers[:2]).all() and np.isnan(layers[2, :4]).all()
    # The pool's own view is the caller's memory.
    assert np.from_dlpack(pool.k_buffer(2)).ctypes.data == layers[2].ctypes.data


def test_wrapped_fp8_pool_stores_scaled_e4m3_codes():
    k = [np.zeros((8, 1, 16), np.uint8)]
    v = [np.zeros((8, 1, 16), np.uint8)]
    pool = ak.MHAKVPool.wrap(k, v, page_size=4, dtype="fp8_e4m3")
    assert pool.dtype == "fp8_e4m3"
    pool.set_kv(0, np.array([5], dtype=np.int64), np.full((1, 1, 16), 448.0, np.float32),
                np.full((1, 1, 16), -2.0, np.float32), k_scale=2.0)
    # 448 / k_scale 2 = 224 = 1.75 * 2^7: exponent field 14, mantissa 6 -> 0 1110 110 = 0x76.
    assert (k[0][5] == 0x76).all()
    # -2 = -1.0 * 2^1: sign 1, exponent field 8, mantissa 0 -> 1 1000 000 = 0xC0.
    assert (v[0][5] == 0xC0).all()
    exported = np.from_dlpack(pool.k_buffer(0))
    assert exported.dtype == np.uint8 and exported.ctypes.data == k[0].ctypes.data


def test_bf16_pool_over_uint16_storage():
    k = np.zeros((1, 8, 1, 16), np.uint16)
    v = np.zeros((1, 8, 1, 16), np.uint16)
    pool = ak.MHAKVPool.wrap(k, v, page_size=4, dtype="bf16")
    x = np.full((1, 1, 16), 1.0 + 2.0**-8, np.float32)  # a tie: rounds to even (1.0)
    pool.set_kv(0, np.array([6], dtype=np.int64), x, -3 * x)
    assert (k[0, 6] == 0x3F80).all()
    # -3 * (1 + 2^-8) = -1.50586 * 2^1: 0.75 ulp above -1.5 * 2^1, rounds to -1.5078 * 2^1.
    assert (v[0, 6] == 0xC041).all()


def test_req_to_token_pool_rows_and_table():
    table = ak.ReqToTokenPool(3, 16)
    assert table.available == 3
    rows = [table.alloc() for _ in range(3)]
    assert sorted(rows) == [1, 2, 3]
    with pytest.raises(ak.OutOfMemoryError):
        table.alloc()
    table.write(rows[0], 2, [40, 41, 42])
    view = np.from_dlpack(table.table())
    assert view.shape == (4, 16) and view.dtype == np.int32
    np.testing.assert_array_equal(view[rows[0], 2:5], [40, 41, 42])
    np.testing.assert_array_equal(table.host_row(rows[0])[2:5], [40, 41, 42])
    assert (view[0] == 0).all()
    table.free(rows[1])
    assert table.available == 1
    with pytest.raises(ak.InvalidArgumentError):
        table.free(rows[1])  # double free
    # max_slot bounds every entry written; it drops when the row holding it is freed.
    assert table.max_slot == 42
    table.write(rows[2], 0, [900])
    assert table.max_slot == 900
    table.free(rows[2])
    assert table.max_slot == 42


def test_page_allocator_fills_partial_pages_first():
    allocator = ak.PageAllocator(8, 4)
    first = allocator.alloc_extend([0, 0], [6, 3], [-1, -1])
    assert len(first) == 9 and first.dtype == np.int64
    pages = {int(s) // 4 for s in first}
    assert 0 not in pages and len(pages) == 3
    # Request 0 grows from 6 to 8 tokens: both new slots land in its partial page.
    more = allocator.alloc_extend([6], [8], [int(first[5])])
    assert [int(s) // 4 for s in more] == [int(first[5]) // 4] * 2
    decode = allocator.alloc_decode([9], [int(more[-1])])
    assert int(decode[0]) // 4 not in pages  # page full: a new one
    allocator.free_slots(first[6:])
    assert allocator.is_allocated(int(first[0]) // 4)


def test_resolve_returns_decision_with_reasons():
    selection = ak.resolve(LLAMA, "cpu")
    assert selection.prefill_backend in ("intel_amx", "torch_native")
    assert selection.reasons and all(isinstance(r, str) for r in selection.reasons)
    as_dict = selection.to_dict()
    assert as_dict["prefill_backend"] == selection.prefill_backend
    assert "reasons" in selection.to_text()
    hopper = ak.select(LLAMA, "sm90", page_size=16, kv_cache_dtype="fp8_e4m3")
    assert hopper.decode_backend == "fa3"
    assert hopper.page_size == 16 and hopper.kv_dtype == "fp8_e4m3"
    explicit = ak.resolve(LLAMA, ak.device_info("sm80"), attention_backend="triton")
    assert (explicit.prefill_backend, explicit.decode_backend) == ("triton", "triton")


def test_create_backend_from_a_selection():
    selection = ak.resolve(LLAMA, "cpu", attention_backend="torch_native")
    pool = ak.MHAKVPool(1, 16, selection.page_size, 2, 64, dtype="f32")
    table = ak.ReqToTokenPool(2, 16)
    backend = ak.create_backend(selection, kv_pool=pool, req_to_token_pool=table, num_q_heads=8,
                                q_dtype="f32")
    assert backend.name == "torch_native"
    assert backend.device == pool.device == "cpu"
    assert backend.descriptor["cuda_graph"] is False
    with pytest.raises(ak.UnsupportedError):
        backend.init_cuda_graph_state(4, 4)


def test_matrix_rows_follow_the_design_contract():
    rows = {r["name"]: r for r in ak.matrix()}
    assert set(ak.backend_names()) == set(rows)
    torch_native = rows["torch_native"]["mha"]
    # DESIGN.md: page>1 native / FP8 KV / FP4 KV / topk1 / topk>1 / window / multimodal:
    # no / yes / yes / no / no / no / yes.
    assert torch_native["pages"] == "no (token indices)"
    assert (torch_native["fp8_kv"], torch_native["fp4_kv"], torch_native["multimodal"]) == (
        True, True, True)
    assert rows["torch_native"]["cuda_graph"] is False
    assert rows["flashmla"]["mla"]["native_page_sizes"] == [64]
    assert rows["torch_native"]["built"]
    cpu_built = [n for n in ("torch_native", "intel_amx") if rows[n]["built"]]
    assert ak.built_backends("cpu") == cpu_built


def test_device_info_reports_consistent_isa_flags():
    # The detected device (the CPU where no GPU is visible): AVX512-BF16 / VBMI imply AVX-512,
    # which implies AVX2; AMX (the OS granted the tiles) comes with BF16 and VBMI.
    d = ak.device_info()
    if d.has_avx512_bf16 or d.has_avx512_vbmi:
        assert d.has_avx512
    if d.has_avx512:
        assert d.has_avx2
    if d.has_amx_bf16:
        assert d.has_avx512_bf16 and d.has_avx512_vbmi
    # The virtual CPUs: a Xeon with AMX, and AVX-512 without the BF16 level.
    xeon = ak.device_info("cpu")
    assert xeon.has_amx_bf16 and xeon.has_avx512_bf16 and xeon.has_avx512_vbmi
    noamx = ak.device_info("cpu-noamx")
    assert noamx.has_avx512 and not noamx.has_amx_bf16 and not noamx.has_avx512_vbmi
