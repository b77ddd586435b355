// glibc >= 2.35 ships SIMD variants of expf in libmvec (linked through libm.so), but <math.h>
// announces them only under -ffast-math. Announcing it here lets the compiler vectorise the
// exponentials of the attention softmax (attention.cpp, built without errno for it). The attribute
// is GCC's: clang (the fuzzing build) does not know it and calls the scalar expf. (The
// activations' exp and tanh are our own, kernels::exp_f / tanh_f: no libm call to vectorise.)
#pragma once
#include <cmath>

#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__FAST_MATH__) && !defined(__clang__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
extern "C" float expf(float) noexcept __attribute__((__simd__("notinbranch")));
#endif
