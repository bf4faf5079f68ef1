"""Runtime kernels and the state layouts they share: the numba helpers that the compiler's
generated kernel modules import and that the engines call on the state they hold
(`seq_runtime`, `seq_aip_runtime`, `window_kernels`), and the slot numbers of those arrays
(`seq_layout`). Neither `cep_core.compiler` nor `cep_core.engine` is imported from here;
both import from here.
"""
