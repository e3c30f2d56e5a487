"""``pyverbs.dma_util``: DMA barriers and MMIO writes (see :mod:`softverbs.hostmem`)."""

from softverbs.hostmem import (
    mmio_write32_as_be,
    mmio_write64_as_be,
    udma_from_dev_barrier,
    udma_to_dev_barrier,
)

__all__ = [
    "mmio_write32_as_be",
    "mmio_write64_as_be",
    "udma_from_dev_barrier",
    "udma_to_dev_barrier",
]
