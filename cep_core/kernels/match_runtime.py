"""What a generated MATCH kernel (`cep_core.compiler.match`) and the MATCH engine
(`cep_core.engine.match`) share: the status codes the kernel returns, the counters it
reads and writes back, the keys of the state columns the engine reads, the dtypes of
attribute kinds, and the `prefetch` intrinsic the kernels call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.base import BaseContext
from numba.core.typing.context import Context
from numba.core.typing.templates import Signature
from numba.extending import intrinsic

# Status codes the kernel returns with the index of the event it stopped before.
DONE, FULL_OUTPUT, FULL_SLOTS, FULL_CANDIDATES, FULL_LOG, FULL_COLLECT = range(6)
# Counters the kernel reads and writes back (`ctr` array).
CTR = ("free_top", "high", "out_n", "dead_n", "clock", "log_n", "coll_n")
# Keys of state columns: a candidate's event count, a slot's Collect log head.
COUNT = ("cnt",)
HEAD = ("head",)


def dtype_of(kind: str) -> str:
    """The numpy dtype of a value of an attribute kind ("int", "float", "bool", ...)."""
    return {"float": "float64", "bool": "bool_"}.get(kind, "int64")


# llvmlite is untyped: its IR values are Any.
Codegen = Callable[[BaseContext, Any, Signature, Sequence[Any]], Any]


# How many rows ahead the kernels fetch a key's row into the cache; its records (MATCH's
# candidates, MATCH_RECOGNIZE's runs) half as many, once the key's row says where they are.
PREFETCH = 16


@intrinsic
def prefetch(typingctx: Context, array: types.Type, index: types.Type
             ) -> tuple[Signature, Codegen] | None:
    """Hint the CPU to fetch `array[index]` into cache (LLVM's prefetch: read, keep)."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context: BaseContext, builder: Any, signature: Signature,
                args: Sequence[Any]) -> Any:
        # numba's lowering API (BaseContext, cgutils) is unannotated
        array_of = context.make_array(signature.args[0])  # type: ignore[no-untyped-call]
        data = array_of(context, builder, args[0]).data
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        function = cgutils.get_or_insert_function(  # type: ignore[no-untyped-call]
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        address = builder.bitcast(builder.gep(data, [args[1]]), i8p)
        builder.call(function, [address, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()  # type: ignore[no-untyped-call]

    return types.void(array, index), codegen
