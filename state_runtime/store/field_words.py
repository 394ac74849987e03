"""Where each block's value fields lie in a run file on local disk, so that a batch lookup
takes the values of a value type made of plain numbers with numpy, not with Arrow.

Taking a block's values through Arrow costs a record batch read from the mapped file and a
take (about 30 µs a block alone, several times that under load): a batch of random keys
touches every block of a run, so that cost followed the run's size. For a value struct whose
fields are all integers or floats, each field's data is an array of plain words in the file.
Where a block's lie is learnt from the zero-copy batches the Arrow path reads (the address of
each field's data buffer, less the mapping's), once per block and run; afterwards the values
of the probes in that block are read from the mapped words with one vectorised gather per
field. A block whose value struct or a field holds a null (a removal) is never learnt and
keeps the Arrow path.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def _plain(value_type: pa.DataType) -> bool:
    """Whether ``value_type`` is a struct of integers and floats (no float16) only."""
    return (
        pa.types.is_struct(value_type)
        and value_type.num_fields > 0
        and all(
            pa.types.is_integer(field.type)
            or (pa.types.is_floating(field.type) and field.type.bit_width >= 32)
            for field in value_type
        )
    )


class FieldWords:
    """Per block of a run file, where each value field's data starts, in that field's words
    (-1: not learnt)."""

    def __init__(self, value_type: pa.DataType, blocks: int) -> None:
        self.dtypes = [np.dtype(field.type.to_pandas_dtype()) for field in value_type]
        self.at = np.full((blocks, len(self.dtypes)), -1, dtype=np.int64)

    @classmethod
    def of(cls, value_type: pa.DataType, blocks: int) -> FieldWords | None:
        """The words of a run with these values and blocks, or None where its values are not
        plain numbers."""
        return cls(value_type, blocks) if _plain(value_type) else None

    @property
    def nbytes(self) -> int:
        return int(self.at.nbytes)

    def learn(
        self, mapping: tuple[int, int], blocks: list[int], batches: list[pa.RecordBatch]
    ) -> None:
        """Learn ``blocks`` from their record batches, zero-copy views of a mapping of the
        file starting at address ``mapping[0]``, ``mapping[1]`` bytes long. A block whose
        field data does not lie wholly inside the mapping (a batch that is not such a view)
        is not learnt and keeps the Arrow path."""
        base, size = mapping
        for b, batch in zip(blocks, batches, strict=True):
            column = batch.column(2)
            if column.null_count:
                continue
            fields = [column.field(i) for i in range(len(self.dtypes))]
            if any(field.null_count for field in fields):
                continue
            at = [
                (field.buffers()[1].address + field.offset * dtype.itemsize - base, dtype)
                for field, dtype in zip(fields, self.dtypes, strict=True)
            ]
            if any(
                where < 0 or where % dtype.itemsize or where + len(field) * dtype.itemsize > size
                for (where, dtype), field in zip(at, fields, strict=True)
            ):
                continue
            self.at[b, 1:] = [where // dtype.itemsize for where, dtype in at[1:]]
            self.at[b, 0] = at[0][0] // at[0][1].itemsize  # last: a reader checks it first
