"""jitgrad.load on hostile or odd files (issue 8, class 8): every file is crafted by hand here,
byte by byte where zipfile/numpy would refuse to write it. A refusal is always
RuntimeError("Invalid jitgrad file ..."), raised before anything the file merely declares is
allocated; what loads is a native-endian, C-contiguous array the tensor owns."""
import io
import json
import struct
import tracemalloc
import zlib

import numpy as np
import pytest

import jitgrad
from jitgrad import serialization

torch = pytest.importorskip("torch")

INVALID = "Invalid jitgrad file"


# -- crafting files --------------------------------------------------------------------------

def _npy_header(descr, shape, fortran_order=False, version=(1, 0)):
    """The bytes of a .npy header declaring whatever we like (numpy's writer would check it)."""
    text = f"{{'descr': {descr!r}, 'fortran_order': {fortran_order!r}, 'shape': {tuple(shape)!r}, }}"
    length_format = "<H" if version == (1, 0) else "<I"
    pre = 6 + 2 + struct.calcsize(length_format)
    text += " " * ((-(pre + len(text) + 1)) % 64) + "\n"
    return b"\x93NUMPY" + bytes(version) + struct.pack(length_format, len(text)) + text.encode("latin1")


def _npy(arr):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(arr), allow_pickle=False)
    return buf.getvalue()


def _meta(obj):
    return _npy(np.array(json.dumps({"format": 1, "obj": obj})))


class _Member:
    """One zip entry. data is the payload as stored (compressed if method is 8), as bytes or a
    list of chunks; the sizes and CRC default to the true ones and can be made to lie."""

    def __init__(self, name, data, method=0, file_size=None, compress_size=None, crc=None, flags=0):
        self.name, self.method, self.flags = name.encode(), method, flags
        self.chunks = [data] if isinstance(data, bytes) else data
        self.compress_size = sum(len(c) for c in self.chunks) if compress_size is None else compress_size
        self.file_size = self.compress_size if file_size is None else file_size
        self.crc = zlib.crc32(b"".join(self.chunks)) if crc is None else crc


def _write_zip(path, members):
    with open(path, "wb") as f:
        offsets = []
        for m in members:
            offsets.append(f.tell())
            f.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, m.flags, m.method, 0, 0x21,
                                m.crc, m.compress_size, m.file_size, len(m.name), 0) + m.name)
            f.writelines(m.chunks)
        cd_start = f.tell()
        for m, off in zip(members, offsets):
            f.write(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, m.flags, m.method, 0, 0x21, m.crc,
                                m.compress_size, m.file_size, len(m.name), 0, 0, 0, 0, 0, off) + m.name)
        cd_size = f.tell() - cd_start
        f.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), cd_size, cd_start, 0))
    return path


def _file(tmp_path, obj, arrays, name="f.pt"):
    """A jitgrad file holding the structure obj and the array members {"a0": npy bytes, ...}."""
    members = [_Member(k + ".npy", v) for k, v in arrays.items()] + [_Member("__jitgrad__.npy", _meta(obj))]
    return _write_zip(tmp_path / name, members)


def _refused(path, match=""):
    with pytest.raises(RuntimeError, match=INVALID) as e:
        jitgrad.load(path)
    assert match in str(e.value), str(e.value)
    return e.value


def _peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def _deflated_repeat(head, chunk, repeats):
    """A raw deflate stream of head + chunk * repeats, made without ever holding the inflated
    data: after a full flush the compressor starts afresh, so every chunk compresses to the same
    bytes and is written once, repeated. Returns (compressed chunks, crc, inflated size)."""
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    first = c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(head)
    for _ in range(repeats):
        crc = zlib.crc32(chunk, crc)
    return [first] + [block] * repeats + [c.flush()], crc, len(head) + len(chunk) * repeats


def _tensor_rec(i, requires_grad=False, ref=0):
    return {"tensor": i, "ref": ref, "requires_grad": requires_grad, "parameter": False}


# -- declared sizes: nothing big is allocated ---------------------------------------------------

def test_deflate_bomb_member_is_refused_without_inflating(tmp_path):
    # 2 MB in the file, 2 GiB of float64 zeros once inflated, and every declared size agrees
    count = 1 << 28
    chunks, crc, size = _deflated_repeat(_npy_header("<f8", (count,)), bytes(1 << 24), (count * 8) >> 24)
    p = _write_zip(tmp_path / "bomb.pt", [_Member("a0.npy", chunks, method=8, file_size=size, crc=crc),
                                          _Member("__jitgrad__.npy", _meta(_tensor_rec(0)))])
    assert p.stat().st_size < 3 << 20
    peak = _peak_bytes(lambda: _refused(p, "compressed"))
    assert peak < 16 << 20, peak


def test_deflated_structure_record_bomb_is_refused(tmp_path):
    # a 1.5 MB record whose string is 400M characters (1.6 GB as numpy's UCS-4): JSON and spaces
    text = json.dumps({"format": 1, "obj": None}).encode("utf-32-le")
    spaces = " ".encode("utf-32-le") * (1 << 22)
    repeats = 95
    n_chars = len(text) // 4 + (1 << 22) * repeats
    chunks, crc, size = _deflated_repeat(_npy_header(f"<U{n_chars}", ()) + text, spaces, repeats)
    p = _write_zip(tmp_path / "meta_bomb.pt", [_Member("__jitgrad__.npy", chunks, method=8, file_size=size, crc=crc)])
    assert p.stat().st_size < 2 << 20
    peak = _peak_bytes(lambda: _refused(p, "compressed"))
    assert peak < 16 << 20, peak


def test_structure_record_beyond_the_bound_is_refused(tmp_path, monkeypatch):
    p = _file(tmp_path, {"list": [None] * 2000}, {})  # 12000 characters
    assert jitgrad.load(p) == [None] * 2000
    monkeypatch.setattr(serialization, "_MAX_META_CHARS", 1000)
    _refused(p, "allowed for it")


@pytest.mark.parametrize("shape", [(1 << 40,), (1 << 20, 1 << 20)], ids=["8TB", "8TB_2d"])
def test_header_declaring_terabytes_is_refused(tmp_path, shape):
    p = _file(tmp_path, _tensor_rec(0), {"a0": _npy_header("<f8", shape) + bytes(16)})
    peak = _peak_bytes(lambda: _refused(p, "declares shape"))
    assert peak < 1 << 20, peak


def test_zip_entry_declaring_more_than_the_file_holds_is_refused(tmp_path):
    # the zip directory and the .npy header agree on ~4 GiB; the file holds 8 bytes of it
    count = (0xFFFF0000 - 128) // 8
    data = _npy_header("<f8", (count,)) + bytes(8)
    lie = len(data) - 8 + count * 8
    p = _write_zip(tmp_path / "lie.pt", [_Member("a0.npy", data, file_size=lie, compress_size=lie),
                                        _Member("__jitgrad__.npy", _meta(_tensor_rec(0)))])
    peak = _peak_bytes(lambda: _refused(p, "more than the file holds"))
    assert peak < 1 << 20, peak


@pytest.mark.parametrize("shape", [(1 << 62, 1 << 62), (1 << 62, 1 << 62, 0), (1 << 64,), (-1, 4), (2, -2),
                                   (True, 3), tuple([1] * 65)],
                         ids=["overflow", "overflow_empty", "beyond_intp", "negative", "negative2", "bool_dim",
                              "65_dims"])
def test_invalid_shapes_are_refused(tmp_path, shape):
    p = _file(tmp_path, _tensor_rec(0), {"a0": _npy_header("<f8", shape) + bytes(8)})
    _refused(p, "shape")


def test_member_holding_more_than_its_header_says_is_refused(tmp_path):
    p = _file(tmp_path, _tensor_rec(0), {"a0": _npy(np.arange(3.0)) + bytes(8)})
    _refused(p, "declares shape")


def test_oversized_npy_header_is_refused(tmp_path):
    head = _npy_header("<f8", (1,), version=(2, 0))
    head = head[:8] + struct.pack("<I", 1 << 30) + head[12:]
    p = _file(tmp_path, _tensor_rec(0), {"a0": head + bytes(8)})
    _refused(p, "header")


# -- dtypes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("descr", [">f8", ">f4", ">i8", ">i4"])
def test_big_endian_members_load_native_with_torch_gradients(tmp_path, descr):
    x = np.array([[1.5, -2.0, 3.25], [0.5, 4.0, -1.0]]).astype(descr)
    p = _file(tmp_path, {"list": [_tensor_rec(0, ref=0), {"ndarray": 0}]}, {"a0": _npy(x)})
    t, arr = jitgrad.load(p)
    native = x.dtype.newbyteorder("=")
    assert t.numpy().dtype == native and t.numpy().dtype.isnative and arr.dtype.isnative
    np.testing.assert_array_equal(t.numpy(), x)
    if x.dtype.kind == "f":
        t.requires_grad_(True)
        w = jitgrad.tensor([2.0, -1.0, 0.5], dtype=t.dtype)
        ((t * t * w).sum() + t.exp().mean()).backward()
        tt = torch.tensor(x.astype(native), requires_grad=True)
        ((tt * tt * torch.tensor([2.0, -1.0, 0.5], dtype=tt.dtype)).sum() + tt.exp().mean()).backward()
        np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-6)


@pytest.mark.parametrize("arr", [np.arange(4, dtype=np.float16), np.arange(4, dtype=np.uint8),
                                 np.arange(4, dtype=np.int16), np.arange(4) * (1 + 2j),
                                 np.array(["ab", "cd"]), np.array([b"ab"]),
                                 np.arange(4, dtype=">f2")],
                         ids=["float16", "uint8", "int16", "complex", "str", "bytes", "big_endian_float16"])
def test_tensor_of_unsupported_dtype_is_refused(tmp_path, arr):
    p = _file(tmp_path, _tensor_rec(0), {"a0": _npy(arr)})
    _refused(p, "jitgrad tensors do not support")
    # the same member as a plain ndarray is legitimate numpy data and loads, native
    q = _file(tmp_path, {"ndarray": 0}, {"a0": _npy(arr)}, name="g.pt")
    out = jitgrad.load(q)
    assert out.dtype.isnative and out.dtype == arr.dtype.newbyteorder("=")
    np.testing.assert_array_equal(out, arr)


@pytest.mark.parametrize("descr", ["|O", "|V8", [("a", "<f4"), ("b", "<f4")], ("<f4", (2,))],
                         ids=["object", "void", "structured", "subarray"])
def test_members_of_non_plain_dtypes_are_refused(tmp_path, descr):
    p = _file(tmp_path, {"ndarray": 0}, {"a0": _npy_header(descr, (1,)) + bytes(8)})
    _refused(p)


def test_int_tensor_marked_requires_grad_is_refused(tmp_path):
    p = _file(tmp_path, _tensor_rec(0, requires_grad=True), {"a0": _npy(np.arange(3))})
    _refused(p, "requires_grad")


def test_bool_member_bytes_other_than_0_1_load_as_true(tmp_path):
    raw = np.array([0, 1, 2, 255], np.uint8)
    p = _file(tmp_path, _tensor_rec(0), {"a0": _npy_header("|b1", (4,)) + raw.tobytes()})
    t = jitgrad.load(p)
    assert t.dtype == jitgrad.bool
    assert t.numpy().view(np.uint8).tolist() == [0, 1, 1, 1]
    assert (t == jitgrad.tensor([False, True, True, True])).numpy().all()


# -- layout: what loads is the tensor's own C-contiguous array --------------------------------

def test_fortran_order_member_loads_c_contiguous_with_torch_gradients(tmp_path):
    x = np.asfortranarray(np.arange(12.0).reshape(3, 4) / 7)
    p = _file(tmp_path, _tensor_rec(0, requires_grad=True), {"a0": _npy(x)})
    assert b"'fortran_order': True" in (tmp_path / "f.pt").read_bytes()
    t = jitgrad.load(p)
    a = t.detach().numpy()
    assert a.flags.c_contiguous and a.flags.writeable and a.dtype.isnative
    np.testing.assert_array_equal(a, x)
    w = np.arange(4.0) - 1.5
    (t * jitgrad.tensor(w)).sum(dim=0).pow(2).sum().backward()
    tt = torch.tensor(x, requires_grad=True)
    (tt * torch.tensor(w)).sum(dim=0).pow(2).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-12)


def test_loaded_arrays_are_independent_and_writable(tmp_path):
    p = tmp_path / "ok.pt"
    jitgrad.save({"w": jitgrad.tensor([1.0, 2.0]), "b": jitgrad.tensor([[3, 4]])}, p)
    a, b = jitgrad.load(p), jitgrad.load(p)
    for k in ("w", "b"):
        arr = a[k].numpy()
        assert arr.flags.c_contiguous and arr.flags.writeable and arr.dtype.isnative
    a["w"].numpy()[0] = 9.0
    assert b["w"].numpy()[0] == 1.0 and jitgrad.load(p)["w"].numpy()[0] == 1.0


def test_file_object_positioned_after_other_data_loads(tmp_path):
    buf = io.BytesIO()
    buf.write(b"header of some container" * 3)
    start = buf.tell()
    jitgrad.save({"w": jitgrad.tensor([1.0, 2.0])}, buf)
    buf.seek(start)
    np.testing.assert_array_equal(jitgrad.load(buf)["w"].numpy(), [1.0, 2.0])


# -- archive structure -------------------------------------------------------------------------

def test_duplicate_member_names_are_refused(tmp_path):
    p = _write_zip(tmp_path / "dup.pt", [_Member("a0.npy", _npy(np.zeros(2))), _Member("a0.npy", _npy(np.ones(2))),
                                         _Member("__jitgrad__.npy", _meta(_tensor_rec(0)))])
    _refused(p, "duplicate member")
    q = _write_zip(tmp_path / "dupmeta.pt", [_Member("__jitgrad__.npy", _meta(None)),
                                             _Member("__jitgrad__.npy", _meta(_tensor_rec(0)))])
    _refused(q, "duplicate member")


def test_member_that_is_not_npy_is_refused(tmp_path):
    p = _write_zip(tmp_path / "raw.pt", [_Member("a0", b"\0" * 16), _Member("__jitgrad__.npy", _meta(_tensor_rec(0)))])
    _refused(p, "unexpected member")


def test_encrypted_member_is_refused(tmp_path):
    p = _write_zip(tmp_path / "enc.pt", [_Member("a0.npy", _npy(np.zeros(2)), flags=1),
                                         _Member("__jitgrad__.npy", _meta(_tensor_rec(0)))])
    _refused(p, "encrypted")


@pytest.mark.parametrize("prefix", [b"\x93NUMPZ\x01\x00", b"\x93NUMPY\x03\x00", b"\x93NUMPY\x09\x09", b"PK\x03\x04"],
                         ids=["magic", "version3", "version9", "zip_in_zip"])
def test_member_with_wrong_magic_or_version_is_refused(tmp_path, prefix):
    good = _npy(np.zeros(2))
    p = _file(tmp_path, _tensor_rec(0), {"a0": prefix + good[len(prefix):]})
    _refused(p)


def test_flipped_data_byte_fails_the_crc(tmp_path):
    good = _npy(np.arange(4.0))
    m = _Member("a0.npy", good[:-3] + b"\x01" + good[-2:], crc=zlib.crc32(good))
    p = _write_zip(tmp_path / "crc.pt", [m, _Member("__jitgrad__.npy", _meta(_tensor_rec(0)))])
    _refused(p, "CRC")


def test_every_truncation_is_refused(tmp_path):
    p = tmp_path / "ok.pt"
    jitgrad.save({"w": jitgrad.randn(3, 2), "n": [1, 2]}, p)
    data = p.read_bytes()
    for n in range(0, len(data), 7):
        (tmp_path / "cut.pt").write_bytes(data[:n])
        _refused(tmp_path / "cut.pt")


def test_structure_record_with_invalid_code_points_is_refused(tmp_path):
    body = np.array([0x7B, 0xFFFFFFFF, 0x7D], np.uint32).tobytes()  # numpy: SystemError
    p = _write_zip(tmp_path / "cp.pt", [_Member("__jitgrad__.npy", _npy_header("<U3", ()) + body)])
    _refused(p, "not valid text")


@pytest.mark.parametrize("rec,arrays", [
    ({"npscalar": 0}, {"a0": _npy(np.arange(3.0))}),
    ({"list": [_tensor_rec(0, ref=5), _tensor_rec(1, ref=5)]}, {"a0": _npy(np.zeros(2)), "a1": _npy(np.ones(2))}),
    (_tensor_rec(0, ref=[1]), {"a0": _npy(np.zeros(2))}),
    ({"tensor": 0}, {"a0": _npy(np.zeros(2))}),
], ids=["npscalar_of_array", "ref_names_two_arrays", "unhashable_ref", "no_ref"])
def test_inconsistent_records_are_refused(tmp_path, rec, arrays):
    _refused(_file(tmp_path, rec, arrays))


# -- what save writes still loads ----------------------------------------------------------------

def test_round_trip_of_every_dtype_state_dicts_and_optimizer_state(tmp_path):
    jitgrad.manual_seed(0)
    model = jitgrad.nn.Sequential(jitgrad.nn.Linear(3, 4), jitgrad.nn.ReLU(), jitgrad.nn.Linear(4, 1))
    opt = jitgrad.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(jitgrad.randn(5, 3)).sum().backward()
    opt.step()
    tensors = {str(d): jitgrad.tensor(np.arange(6).reshape(2, 3) % 3, dtype=d)
               for d in (jitgrad.float32, jitgrad.float64, jitgrad.int64, jitgrad.int32, jitgrad.bool)}
    t = jitgrad.tensor([1.0, 2.0], requires_grad=True)
    arrays = [np.arange(4, dtype=np.float16), np.arange(3, dtype=np.uint8), np.arange(2) * 1j, np.array(["s"])]
    obj = {"tensors": tensors, "model": model.state_dict(), "optim": opt.state_dict(), "t": t, "t_again": t,
           "t_view": t.detach(), "arrays": arrays, "scalars": [np.float16(1.5), np.str_("x"), np.int8(-3)],
           "empty": jitgrad.zeros(0, 3), "scalar": jitgrad.tensor(2.5)}
    p = tmp_path / "ck.pt"
    jitgrad.save(obj, p)
    out = jitgrad.load(p)
    for k, v in tensors.items():
        assert out["tensors"][k].dtype == v.dtype
        np.testing.assert_array_equal(out["tensors"][k].numpy(), v.numpy())
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(out["model"][k].numpy(), v.numpy())
    m2 = jitgrad.nn.Sequential(jitgrad.nn.Linear(3, 4), jitgrad.nn.ReLU(), jitgrad.nn.Linear(4, 1))
    m2.load_state_dict(out["model"])
    opt2 = jitgrad.optim.SGD(m2.parameters(), lr=0.5, momentum=0.9)
    opt2.load_state_dict(out["optim"])
    for s, s2 in zip(opt.state.values(), opt2.state.values()):
        np.testing.assert_array_equal(s["momentum_buffer"].numpy(), s2["momentum_buffer"].numpy())
    assert out["t"] is out["t_again"] and out["t"].requires_grad and not out["t_view"].requires_grad
    assert np.shares_memory(out["t"].detach().numpy(), out["t_view"].numpy())
    for a, b in zip(out["arrays"], arrays):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert [type(s) for s in out["scalars"]] == [np.float16, np.str_, np.int8] and out["scalars"][1] == "x"
    assert tuple(out["empty"].shape) == (0, 3) and out["scalar"].item() == 2.5
