"""NPD002 fix: PD transfer item lengths of the NPU MHA pool are one page under FIA.

Port of https://github.com/sgl-project/sglang/pull/15852 (in sglang 0.5.10). With
``ASCEND_USE_FIA=1`` the NPU MHA pool exposes each layer as a token-major view
``(pages * page_size, 1, heads, dim)``, so ``buffer[0]`` is one token; sglang 0.5.9's
``NPUMHATokenToKVPool.get_contiguous_buf_infos`` still reported ``buffer[0].nbytes`` as the
item length, and the PD transfer engine, which moves ``item_len`` bytes per page index,
moved 1/page_size of every page: decode computed on garbage KV. The replacement reports
``buffer[0].nbytes * page_size`` under FIA and keeps everything else (pointers, buffer
lengths, the page-major case) as it was.

Safety: ``unsafe``. It changes how many bytes every PD transfer moves; right for the
layout the pool builds (the check's live probe verifies one page per item on the real
pool), but it is a change to what running code does, so it waits for ``--unsafe``.
Prefill and decode must both run it: ``npudoctor fix --apply`` on both images, or
``npudoctor run`` for both servers.
"""

from __future__ import annotations

from typing import Any

from npudoctor.patching.fixbase import Fix, Safety

POOLS = "sglang.srt.hardware_backend.npu.memory_pool_npu"


def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
    """Pointers, byte lengths and per-page item lengths of every K then every V layer buffer."""
    layers = range(self.start_layer, self.start_layer + self.layer_num)
    buffers = [self.get_key_buffer(i) for i in layers] + [self.get_value_buffer(i) for i in layers]
    tokens_per_item = self.page_size if self.use_fia else 1  # FIA: buffer[0] is one token, not one page
    return (
        [buffer.data_ptr() for buffer in buffers],
        [buffer.nbytes for buffer in buffers],
        [buffer[0].nbytes * tokens_per_item for buffer in buffers],
    )


class TransferItemLengthsOverride(Fix):
    id = "NPD002"
    title = "NPU MHA pool reports one page per PD transfer item under FIA"
    upstream = "https://github.com/sgl-project/sglang/pull/15852"
    safety = Safety.UNSAFE
    replaces = (f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos",)
    # The layouts the item length is one page of, and the accessors it reads them through.
    anchors = (
        f"{POOLS}:NPUMHATokenToKVPool.__init__",
        f"{POOLS}:NPUMHATokenToKVPool._create_buffers",
        f"{POOLS}:NPUMHATokenToKVPool.get_key_buffer",
        f"{POOLS}:NPUMHATokenToKVPool.get_value_buffer",
    )
    # scripts/fix_shapes.py NPD002 0.5.8 0.5.9 (0.5.10 ships the upstream fix)
    written_for = {
        "0.5.8, 0.5.9": {
            f"{POOLS}:NPUMHATokenToKVPool.get_contiguous_buf_infos": "26a4db4e1cac42c6",
            f"{POOLS}:NPUMHATokenToKVPool.__init__": "a8218b4da574070a",
            f"{POOLS}:NPUMHATokenToKVPool._create_buffers": "fb050e0efc04c279",
            f"{POOLS}:NPUMHATokenToKVPool.get_key_buffer": "a1284fea844c6db1",
            f"{POOLS}:NPUMHATokenToKVPool.get_value_buffer": "883b82a9869a93f9",
        }
    }

    def implementations(self) -> dict[str, Any]:
        return {self.replaces[0]: get_contiguous_buf_infos}


FIX = TransferItemLengthsOverride()
