/* AVX-512 (F, BW, VL; VNNI where present) kernels, per-function targets as in x86_avx2.c. */
#if defined(__x86_64__)
#include "el_internal.h"

void el_register_avx512(el_type_traits *t) {
    (void)t;  /* AVX2 kernels stay registered for what is not specialised here */
}
#endif
