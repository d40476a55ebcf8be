"""Interpreter fix-up for the CPU tier: Triton 3.6's interpreter with numpy >= 2.4 cannot use a
run-time value as a loop bound (`range(lo, hi)`): it converts a shape-(1,) array with `int()`,
which numpy 2.4 refuses. Kernels with data-dependent loops (tree_verify_attention) need it, so
the CPU tests convert with `.item()` instead. Compiled kernels on the GPU never take this path.
"""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    import triton.runtime.interpreter as interpreter

    _patch_lang_tensor = interpreter._patch_lang_tensor

    def _patch_with_item_index(tensor, scope):
        _patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = _patch_with_item_index
