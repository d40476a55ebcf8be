"""Interpreter fix-ups for the CPU tier; compiled kernels on the GPU never take these paths.

Loop bounds: Triton 3.6's interpreter with numpy >= 2.4 cannot use a run-time value as a loop
bound (`range(lo, hi)`): it converts a shape-(1,) array with `int()`, which numpy 2.4 refuses.
Kernels with data-dependent loops (tree_verify_attention) need it, so the CPU tests convert with
`.item()` instead.

Dots: the interpreter's `tl.dot` is `np.matmul` on the operands as they lie in memory, and
OpenBLAS's AVX-512 kernels (an AMD EPYC here, 2026-12-03) round a product by its operands' layout:
`a @ b` and `a @ b.T.copy().T` differ in the last bit. A TMA tile transposed in registers
(`.T`) and a pointer tile loaded K-major then give different bits for the same values, which the
GPU's dot never does. The CPU tests make both operands contiguous first, so that a dot's bits
depend on its values only, as on the tensor cores.
"""

import os

import numpy as np

if os.environ.get("TRITON_INTERPRET") == "1":
    import triton.runtime.interpreter as interpreter

    _patch_lang_tensor = interpreter._patch_lang_tensor

    def _patch_with_item_index(tensor, scope):
        _patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = _patch_with_item_index

    _create_dot = interpreter.InterpreterBuilder.create_dot

    def _create_dot_on_contiguous(self, a, b, d, input_precision, max_num_imprecise_acc):
        a = interpreter.TensorHandle(np.ascontiguousarray(a.data), a.dtype)
        b = interpreter.TensorHandle(np.ascontiguousarray(b.data), b.dtype)
        return _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = _create_dot_on_contiguous
