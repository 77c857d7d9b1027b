#!/usr/bin/env bash
# Prints the extra CMake flags llama-cpp-python==0.3.36 needs on this CPU (empty: none; the
# native build, -march=native, is right).
#
# Intel CPUs with AMX (Sapphire Rapids and later): the native build compiles ggml's AMX kernels, and
# llama-cpp-python 0.3.36 built so crashes (SIGSEGV in ggml_backend_amx_mul_mat) on the first prompt
# of a Q4_1 model, plain llama_cpp.Llama included (measured on a 2-core Xeon with amx_int8).
# There: GGML_NATIVE=OFF and every other ISA extension the CPU has, i.e. the native build minus AMX.
# MOA_ALLOW_AMX=1 keeps the native build; MOA_CPUINFO=FILE reads FILE instead of /proc/cpuinfo (tests).
set -euo pipefail
[ "$(uname -m)" = x86_64 ] || exit 0
flags=$(grep -m1 '^flags' "${MOA_CPUINFO:-/proc/cpuinfo}" 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
has amx_int8 && [ "${MOA_ALLOW_AMX:-0}" != 1 ] || exit 0
out="-DGGML_NATIVE=OFF"
for pair in sse4_2:SSE42 f16c:F16C fma:FMA bmi2:BMI2 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI \
            avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  if has "${pair%%:*}"; then out="$out -DGGML_${pair##*:}=ON"; fi
done
if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then out="$out -DGGML_AVX512=ON"; fi
echo "$out"
