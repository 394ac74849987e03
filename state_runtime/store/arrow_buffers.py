"""An Arrow array as its raw buffers with varint lengths: the row body of format 3 deltas.

Arrow IPC describes every buffer and field node in a flatbuffer (about 250 bytes for a
``key``/``value`` batch of one field each) and repeats the schema in every stream. A delta
whose schema is known from elsewhere needs neither: its body is the Arrow buffers themselves,
in the order a depth-first walk of the type visits them, each preceded by its byte length as
a varint (a validity buffer of length 0 means "no nulls"). The reader walks the same type,
rebuilds each array with ``pyarrow.Array.from_buffers`` and validates the result fully, so a
body that does not fit its type fails as a ValueError (the caller reports the file corrupt),
never as a crash or a wrong value.

Child lengths follow from the parents: a struct's children have its length, a list's or map's
child has as many elements as the last offset says. Types outside Spark's (unions,
dictionaries, views, run-end encoded) are not supported: :func:`supported` says so before
writing, and the writer then keeps the self-describing Arrow IPC format.
"""

from __future__ import annotations

import pyarrow as pa

from state_runtime.store.byte_fields import ByteReader, varint

_LISTS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_map)


def supported(t: pa.DataType) -> bool:
    """Whether arrays of ``t`` can be written by :func:`write_array`."""
    if pa.types.is_struct(t):
        return all(supported(f.type) for f in t)
    if any(is_list(t) for is_list in _LISTS) or pa.types.is_fixed_size_list(t):
        return supported(t.value_type if not pa.types.is_map(t) else _entries(t))
    return bool(
        pa.types.is_primitive(t)
        or pa.types.is_decimal(t)
        or pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_string(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or pa.types.is_null(t)
    )


def _entries(t: pa.MapType) -> pa.StructType:
    return pa.struct([t.key_field, t.item_field])


def _plain(arr: pa.Array) -> pa.Array:
    """``arr`` with offset 0 and, for lists, offsets starting at 0 (copied only if not)."""
    if arr.offset == 0 and not (
        len(arr) and any(is_list(arr.type) for is_list in _LISTS) and arr.offsets[0].as_py()
    ):
        return arr
    return pa.concat_arrays([arr])


def write_array(arr: pa.Array, out: bytearray) -> None:
    """Append ``arr``'s buffers (depth first, each length-prefixed) to ``out``."""
    arr = _plain(arr)
    t = arr.type
    for i, buf in enumerate(arr.buffers()[: t.num_buffers]):
        if buf is None or (i == 0 and arr.null_count == 0 and t.num_buffers > 0):
            out += varint(0)
            continue
        data = buf.to_pybytes()[: _needed(arr, i)]
        out += varint(len(data))
        out += data
    for child in _children(arr):
        write_array(child, out)


def _needed(arr: pa.Array, i: int) -> int | None:
    """How many bytes of buffer ``i`` the array uses (buffers may be allocated larger), or
    None for all of it."""
    t, n = arr.type, len(arr)
    if i == 0:
        return (n + 7) // 8
    offsets_width = (
        8 if t in (pa.large_string(), pa.large_binary()) or pa.types.is_large_list(t) else 4
    )
    if i == 1 and (any(is_list(t) for is_list in _LISTS) or _is_binary_like(t)):
        return (n + 1) * offsets_width
    if i == 2 and _is_binary_like(t):
        return _last_offset(arr.buffers()[1], n, offsets_width)
    if i == 1 and (
        pa.types.is_primitive(t) or pa.types.is_decimal(t) or pa.types.is_fixed_size_binary(t)
    ):
        return (n * int(t.bit_width) + 7) // 8
    return None


def _last_offset(offsets: pa.Buffer | None, length: int, width: int) -> int:
    """Entry ``length`` of an offsets buffer (the end of the last element); ValueError if the
    buffer is too short or it is negative."""
    if length == 0 and (offsets is None or offsets.size == 0):
        return 0  # an empty array may have no offsets at all
    if offsets is None or offsets.size < (length + 1) * width:
        raise ValueError(f"offsets buffer holds fewer than {length + 1} entries")
    raw = offsets.to_pybytes()[length * width : (length + 1) * width]
    end = int.from_bytes(raw, "little", signed=True)
    if end < 0:
        raise ValueError(f"negative end offset {end}")
    return end


def _is_binary_like(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_string(t)
        or pa.types.is_large_binary(t)
    )


def _children(arr: pa.Array) -> list[pa.Array]:
    t = arr.type
    if pa.types.is_struct(t):
        return [arr.field(i) for i in range(t.num_fields)]
    if any(is_list(t) for is_list in _LISTS):
        end = arr.offsets[-1].as_py() if len(arr) else 0
        return [arr.values.slice(0, end)]
    if pa.types.is_fixed_size_list(t):
        return [arr.values.slice(0, len(arr) * t.list_size)]
    return []


def read_array(reader: ByteReader, t: pa.DataType, length: int) -> pa.Array:
    """The array of type ``t`` and ``length`` rows written by :func:`write_array`; ValueError
    (or an Arrow error) if the bytes do not fit."""
    buffers: list[pa.Buffer | None] = []
    for i in range(t.num_buffers):
        size = reader.varint()
        if size == 0 and i == 0:
            buffers.append(None)  # no nulls
        else:
            buffers.append(pa.py_buffer(bytes(reader.take(size))))
    children: list[pa.Array] = []
    if pa.types.is_struct(t):
        children = [read_array(reader, f.type, length) for f in t]
    elif any(is_list(t) for is_list in _LISTS):
        end = _last_offset(buffers[1], length, 8 if pa.types.is_large_list(t) else 4)
        child_type = _entries(t) if pa.types.is_map(t) else t.value_type
        children = [read_array(reader, child_type, end)]
    elif pa.types.is_fixed_size_list(t):
        children = [read_array(reader, t.value_type, length * t.list_size)]
    arr = pa.Array.from_buffers(t, length, buffers, null_count=-1, children=children or None)
    arr.validate(full=True)
    return arr
