// glibc >= 2.35 ships SIMD variants of tanhf (and expf) in libmvec (linked through libm.so), but
// <math.h> announces them only under -ffast-math. Announcing them here lets the compiler vectorise
// the GELU loops of the CPU backend (about 6x faster than scalar tanhf on x86-64) and the
// exponentials of the attention softmax (attention.cpp, built without errno for it); the math stays
// the shared kernel bodies of kernels/activations.h. The attribute is GCC's: clang (the fuzzing
// build) does not know it and calls the scalar tanhf.
#pragma once
#include <cmath>

#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__FAST_MATH__) && !defined(__clang__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
extern "C" float tanhf(float) noexcept __attribute__((__simd__("notinbranch")));
extern "C" float expf(float) noexcept __attribute__((__simd__("notinbranch")));
#endif
